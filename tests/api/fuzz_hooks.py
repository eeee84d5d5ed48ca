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


@schemathesis.hook
def before_load_schema(ctx: Any, raw_schema: dict[str, Any]) -> None:
    # The server under fuzz checks no tokens (inputs, not callers: the auth
    # matrix in tests/api/test_auth.py tests those), so the bearer scheme the
    # document declares is not what this run is about.
    raw_schema.get("components", {}).pop("securitySchemes", None)
    for operations in raw_schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                operation.pop("security", None)
