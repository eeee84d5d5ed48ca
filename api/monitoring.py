"""Prometheus metrics at ``/metrics``: what the database says (jobs by state,
the queue, nodes by state, claims), read at scrape time so the figures always
match it, and request latency measured as requests go by."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from fastapi.telemetry import TelemetryConfig
from opentelemetry import _logs, metrics, trace
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from db import queries
from db.engine import Database
from ddpo.lifecycle import JobStatus, NodeState, StopReason
from ddpo.schemas.sweep import TrialState


class DatabaseCollector(Collector):
    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        with self.db.read() as session:
            jobs = queries.job_counts_by_status(session=session)
            nodes = queries.node_counts_by_state(session=session)
            claims = queries.part_count(session=session)
            stops = queries.stop_counts_by_reason(session=session)
            draining = queries.count_draining_nodes(session=session)
            trials = queries.trial_counts_by_state(session=session)
            sweeps = queries.sweep_counts_by_status(session=session)
        by_status = GaugeMetricFamily("ddpo_jobs", "Jobs in each state", labels=["state"])
        for status in JobStatus:
            by_status.add_metric([status.value], jobs.get(status, 0))
        yield by_status
        yield GaugeMetricFamily(
            "ddpo_queue_length",
            "Jobs waiting to start",
            value=jobs.get(JobStatus.QUEUED, 0),
        )
        by_state = GaugeMetricFamily("ddpo_nodes", "Worker nodes in each state", labels=["state"])
        for state in NodeState:
            by_state.add_metric([state.value], nodes.get(state, 0))
        yield by_state
        yield CounterMetricFamily(
            "ddpo_claims",
            "Machine ids of jobs handed to nodes (one per part started)",
            value=claims,
        )
        by_reason = CounterMetricFamily(
            "ddpo_stops",
            "Attempts asked to stop at a step and checkpoint: preempted, drained, resized, "
            "node_leaving, pruned",
            labels=["reason"],
        )
        for reason in StopReason:
            by_reason.add_metric([reason.value], stops.get(reason, 0))
        yield by_reason
        yield GaugeMetricFamily(
            "ddpo_nodes_draining",
            "Nodes drained or leaving: they take no new part",
            value=draining,
        )
        by_sweep = GaugeMetricFamily("ddpo_sweeps", "Sweeps in each state", labels=["state"])
        for status in (
            JobStatus.RUNNING,
            JobStatus.SUCCEEDED,
            JobStatus.FAILED,
            JobStatus.CANCELLED,
        ):
            by_sweep.add_metric([status.value], sweeps.get(status, 0))
        yield by_sweep
        by_trial = GaugeMetricFamily(
            "ddpo_sweep_trials",
            "Sweep trials in each state (pruned: stopped early by the sweep's pruner)",
            labels=["state"],
        )
        for trial_state in TrialState:
            by_trial.add_metric([trial_state.value], trials.get(trial_state, 0))
        yield by_trial
        transactions, waited_s, held_s = self.db.write_lock.totals()
        yield CounterMetricFamily(
            "ddpo_write_transactions",
            "This server's write transactions that took the write lock (a group of submits "
            "and reports is one)",
            value=transactions,
        )
        yield CounterMetricFamily(
            "ddpo_write_lock_waited_seconds",
            "Time this server's write transactions waited for the write lock (on PostgreSQL, "
            "shared by every server on the database)",
            value=waited_s,
        )
        yield CounterMetricFamily(
            "ddpo_write_lock_held_seconds",
            "Time this server's write transactions held the write lock, to their commit: "
            "summed over every server, over the wall time, how busy the one writer is",
            value=held_s,
        )


@dataclass(frozen=True)
class Instruments:
    registry: CollectorRegistry
    latency: Histogram
    tick: Histogram


def make_registry(db: Database) -> Instruments:
    """One registry per app, so several apps in one process (tests) never mix."""
    registry = CollectorRegistry()
    registry.register(DatabaseCollector(db))
    latency = Histogram(
        "ddpo_http_request_duration_seconds",
        "Time to the response's first byte, by route template",
        ["method", "route", "status"],
        registry=registry,
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    )
    tick = Histogram(
        "ddpo_tick_duration_seconds",
        "One turn of the server's clock: lost nodes, deadlines, retries, placement",
        registry=registry,
        buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1),
    )
    return Instruments(registry, latency, tick)


def route_template(route: object) -> str:
    """The latency label: ``/jobs/{job_id}``, not ``/jobs/7``."""
    return getattr(route, "path", None) or "unmatched"


class LatencyMiddleware:
    """Times each HTTP request to the start of its response (a streamed
    response's length is not latency), labelled with the route's template
    rather than its path, so job ids do not explode the label set."""

    def __init__(self, app: ASGIApp, latency: Histogram) -> None:
        self.app = app
        self.latency = latency

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.latency.labels(
                    scope["method"], route_template(scope.get("route")), str(message["status"])
                ).observe(time.perf_counter() - started)
            await send(message)

        await self.app(scope, receive, timed_send)


def fastapi_telemetry() -> TelemetryConfig:
    """FastAPI's own OpenTelemetry spans, metrics and logs: on where they
    have somewhere to go when the app is made (a provider set up in front of
    the server, as ``opentelemetry-instrument`` does, or FastAPI's own
    ``FASTAPI_OTEL_AUTO_CONFIGURE=true``), off otherwise. Left on, FastAPI
    asks every provider on every request whether it is still OpenTelemetry's
    placeholder: 8 µs a request, and an idle node's poll is a request every
    2 s (BENCHMARKS.md, "Idle polls and the garbage collector")."""
    providers = (
        trace.get_tracer_provider(),
        metrics.get_meter_provider(),
        _logs.get_logger_provider(),
    )
    placeholders = all(type(p).__name__.lstrip("_").startswith("Proxy") for p in providers)
    wanted = os.getenv("FASTAPI_OTEL_AUTO_CONFIGURE", "").lower() == "true" or not placeholders
    return TelemetryConfig(tracing=wanted, metrics=wanted, logs=wanted)
