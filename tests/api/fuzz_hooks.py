"""Schemathesis hooks for tests/api/test_fuzz.py (loaded through
SCHEMATHESIS_HOOKS)."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def before_call(ctx: Any, case: schemathesis.Case, **kwargs: Any) -> None:
    # A followed log streams until its job ends, and no job ends here (there
    # are no workers): ask for the lines so far instead. Following is tested
    # end to end (tests/e2e/test_cli.py).
    if case.path == "/jobs/{job_id}/logs" and case.query:
        case.query.pop("follow", None)
