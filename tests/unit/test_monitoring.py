from __future__ import annotations

import pytest
from opentelemetry import trace

from api.monitoring import fastapi_telemetry


class _SetUpProvider(trace.TracerProvider):
    """A provider someone set up (as ``opentelemetry-instrument`` does with
    the SDK's): not OpenTelemetry's placeholder."""

    def get_tracer(self, *args: object, **kwargs: object) -> trace.Tracer:
        return trace.NoOpTracer()


def test_fastapis_telemetry_is_off_with_nowhere_to_send_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FASTAPI_OTEL_AUTO_CONFIGURE", raising=False)
    assert fastapi_telemetry() == {"tracing": False, "metrics": False, "logs": False}


def test_fastapis_telemetry_is_on_where_a_provider_is_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("FASTAPI_OTEL_AUTO_CONFIGURE", raising=False)
    monkeypatch.setattr(trace, "get_tracer_provider", _SetUpProvider)
    assert fastapi_telemetry() == {"tracing": True, "metrics": True, "logs": True}


def test_fastapis_telemetry_is_on_where_fastapi_is_asked_to_set_it_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FASTAPI_OTEL_AUTO_CONFIGURE", "true")
    assert fastapi_telemetry() == {"tracing": True, "metrics": True, "logs": True}
