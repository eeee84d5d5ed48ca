"""How a job looks in a terminal: every function here returns text with
the server's strings shown safe (cli/terminal.py)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import ParamSpec

from cli.terminal import one_line, shown
from ddpo.lifecycle import JobStatus, NodeState, StopReason
from ddpo.schemas import (
    JobPublic,
    JobsPublic,
    NodePublic,
    NodesPublic,
    StudyPublic,
    Topology,
)
from ddpo.schemas.people import AuditPublic, KeysPublic
from ddpo.schemas.public import QueuePublic, TrainersPublic
from ddpo.schemas.sweep import Choice, SweepPublic, SweepsPublic

P = ParamSpec("P")


def _for_terminal(render: Callable[P, str]) -> Callable[P, str]:
    @functools.wraps(render)
    def safe(*args: P.args, **kwargs: P.kwargs) -> str:
        return shown(render(*args, **kwargs))

    return safe


@_for_terminal
def progress_line(job: JobPublic, width: int = 30) -> str:
    if job.progress is None:
        where = ", ".join(f"m{p.machine_id}@{p.node_name}:{p.status.value}" for p in job.parts)
        waiting = "waiting for nodes" if job.status.value == "queued" else ""
        detail = job.pending_reason or where or waiting
        return f"job {job.id} {job.status.value:<10} {detail}".rstrip()
    p = job.progress
    filled = int(width * p.percent / 100)
    bar = "#" * filled + "-" * (width - filled)
    # Rank 0's latest report: one batch's loss and rate, not the epoch's
    # mean or the job's throughput (the summary's), so the labels say so.
    loss = f"{p.loss:.4f}" if p.loss is not None else "-"
    rate = f"{p.samples_per_sec:,.0f} samples/s" if p.samples_per_sec is not None else "-"
    eta = f"  ETA {duration(p.eta_seconds)}" if p.eta_seconds is not None else ""
    return (
        f"job {job.id} {job.status.value:<10} [{bar}] {p.percent:5.1f}%  "
        f"epoch {p.epoch}/{p.epochs} batch {p.batch}/{p.batches_per_epoch}  "
        f"batch loss {loss}  batch rate {rate}{eta}"
    )


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@_for_terminal
def jobs_table(jobs: JobsPublic) -> str:
    lines = [
        f"{'id':>5}  {'status':<10} {'topology':<9} {'batch':>5} {'epochs':>6} "
        f"{'progress':>8} {'duration':>9} {'accuracy':>8}  {'owner':<14} name"
    ]
    for job in jobs.data:
        t = job.spec.topology
        progress = f"{job.progress.percent:.0f}%" if job.progress is not None else "-"
        accuracy = (
            f"{100 * job.result.test_accuracy:.2f}%"
            if job.result is not None and job.result.test_accuracy is not None
            else "-"
        )
        lines.append(
            f"{job.id:>5}  {job.status.value:<10} {f'{_machines(t)} x {t.num_processes}':<9} "
            f"{job.spec.batch_size:>5} {job.spec.epochs:>6} {progress:>8} "
            f"{duration(job.timing.running_seconds):>9} {accuracy:>8}  {job.owner or '-':<14} "
            f"{one_line(job.name or '')}"
        )
        if job.pending_reason:
            lines.append(f"{'':>7}waiting: {one_line(job.pending_reason)}")
    lines.append(f"({len(jobs.data)} of {jobs.count})")
    return "\n".join(lines)


@_for_terminal
def queue_table(queue: QueuePublic) -> str:
    lines = [
        f"{'pos':>4} {'job':>5} {'priority':>8} {'owner':<14} {'needs':<24} {'code':<18} reason"
    ]
    for entry in queue.data:
        needs = entry.needs
        what = needs.script or needs.trainer or ""
        gpus = f", {needs.gpus_per_node} GPU" if needs.gpus_per_node else ""
        wants = f"{needs.nodes} node(s){gpus}, {what}"
        lines.append(
            f"{entry.position:>4} {entry.job_id:>5} {entry.priority:>8} {entry.owner or '-':<14} "
            f"{one_line(wants):<24} {entry.pending.code.value:<18} "
            f"{one_line(entry.pending.reason)}"
        )
    lines.append(
        f"({queue.count} queued; {queue.nodes_live} live node(s), {queue.slots_free} free slot(s))"
    )
    return "\n".join(lines)


@_for_terminal
def node_state(node: NodePublic) -> str:
    """live, lost, revoked; a live node being drained: draining while its
    parts run, drained once none does; leaving while its worker shuts down."""
    if node.drain is None or node.state is not NodeState.LIVE:
        return node.state.value
    if node.drain.reason is StopReason.NODE_LEAVING:
        return "leaving"
    return "draining" if node.parts else "drained"


def nodes_table(nodes: NodesPublic) -> str:
    now = datetime.now(timezone.utc)
    lines = [
        f"{'id':>4}  {'name':<16} {'address':<16} {'state':<8} {'slots':>5} {'cpus':>4} "
        f"{'gpus':>4} {'heartbeat':>10}  running"
    ]
    for node in nodes.data:
        ago = duration((now - node.last_heartbeat_at).total_seconds()) + " ago"
        running = ", ".join(
            f"job {p.job_id} m{p.machine_id} ({p.status.value})" for p in node.parts
        )
        lines.append(
            f"{node.id:>4}  {one_line(node.name):<16} {one_line(node.address):<16} "
            f"{node_state(node):<8} "
            f"{node.slots:>5} {node.cpus:>4} {node.gpus:>4} {ago:>10}  {running or '-'}"
        )
    if nodes.count > len(nodes.data):
        lines.append(f"({len(nodes.data)} of {nodes.count})")
    return "\n".join(lines)


@_for_terminal
def trainers_table(offered: TrainersPublic) -> str:
    lines = [f"{'trainer':<20} {'version':<10} params (default)  nodes"]
    for trainer in offered.trainers:
        schema = trainer.params_schema
        if schema is None:
            params = "(not declared)"
        else:
            fields = schema.get("properties", {})
            params = (
                ", ".join(
                    f"{name}={json.dumps(field['default'])}" if "default" in field else name
                    for name, field in fields.items()
                )
                or "none"
            )
        lines.append(
            f"{trainer.name:<20} {one_line(trainer.version):<10} {one_line(params)}  "
            f"{', '.join(trainer.nodes)}"
        )
    if offered.scripts:
        lines += ["", f"{'script':<31} {'sha256':<12}  nodes"]
        lines += [f"{s.path:<31} {s.sha256[:12]}  {', '.join(s.nodes)}" for s in offered.scripts]
    return "\n".join(lines)


def _machines(topology: Topology) -> str:
    """3, or an elastic job's range: 1-3."""
    if topology.max_machines is None:
        return str(topology.num_machines)
    return f"{topology.num_machines}-{topology.max_machines}"


def _s(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "-"


@_for_terminal
def summary(job: JobPublic) -> str:
    t = job.timing
    topology = job.spec.topology
    lines = [
        f"job {job.id} {job.status.value}: {_machines(topology)} machine(s) x "
        f"{topology.num_processes} process(es), {_what_runs(job)}, {job.spec.backend}",
        "timing:",
        f"  queued    {_s(t.queued_seconds)}",
        f"  running   {_s(t.running_seconds)}  (setup {_s(t.setup_seconds)}, "
        f"training {_s(t.training_seconds)}, evaluation {_s(t.eval_seconds)})",
    ]
    for part in job.parts:
        lines.append(
            f"  machine {part.machine_id} on {one_line(part.node_name)}: {part.status.value}"
        )
    if job.status is JobStatus.QUEUED and job.pending_reason:
        lines.append(f"waiting: {one_line(job.pending_reason)}")
    if len(job.attempts) > 1 or any(a.stop for a in job.attempts):
        lines.append("attempts:")
        for a in job.attempts:
            start = (
                f"from step {a.resumed_from_step}"
                if a.resumed_from_step is not None
                else f"from epoch {a.resumed_from_epoch}"
                if a.resumed_from_epoch is not None
                else "from the start"
            )
            now = a.ended or (
                f"stopping ({a.stop.reason}{f' {a.stop.detail}' if a.stop.detail else ''})"
                if a.stop
                else "running"
            )
            lines.append(
                f"  {a.number}: {a.world_size} rank(s), global batch {a.global_batch}, {start}: "
                f"{one_line(now)}"
            )
    r = job.result
    if r is not None:
        if r.test_accuracy is not None:
            lines.append(
                f"result: test accuracy {100 * r.test_accuracy:.2f}%, test loss "
                f"{_f(r.test_loss, '.4f')}, last epoch's mean train loss {_f(r.train_loss, '.4f')}"
            )
        if r.samples_per_sec is not None:
            lines.append(
                f"throughput: {r.samples_per_sec:,.0f} samples/s (the whole job, over its "
                "training time)"
            )
    if job.error is not None:
        e = job.error
        lines.append(f"error ({e.reason}): {one_line(e.message)}")
        if e.traceback_tail:
            lines.append("  " + e.traceback_tail.strip().replace("\n", "\n  "))
    return "\n".join(lines)


def _what_runs(job: JobPublic) -> str:
    """A script runs as it likes (its own epochs, its own batches): its
    path and arguments say what it does; a trainer's, the spec's numbers."""
    script = job.spec.script
    if script is not None:
        return f"script {script.path}" + (f" {' '.join(script.args)}" if script.args else "")
    trainer = "" if job.spec.trainer == "mnist" else f"trainer {job.spec.trainer}, "
    return f"{trainer}batch {job.spec.batch_size}/process, {job.spec.epochs} epoch(s)"


def _f(value: float | None, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-"


@_for_terminal
def study_table(study: StudyPublic) -> str:
    spec = study.spec
    lines = [
        f"study {study.id} {study.status.value}: trainer {spec.trainer}, {spec.epochs} epoch(s), "
        f"{spec.backend}; speedup and efficiency against the first row's training time",
        f"{'topology':<10} {'batch':>6} {'threads':>7} {'wall s':>7} {'train s':>8} "
        f"{'samples/s':>10} {'speedup':>8} {'effic.':>7} {'loss':>7} {'test acc':>9}  status",
    ]
    for row in study.rows:
        accuracy = f"{100 * row.test_accuracy:.2f}%" if row.test_accuracy is not None else "-"
        lines.append(
            f"{f'{row.num_machines} x {row.num_processes}':<10} {row.batch_size:>6} "
            f"{_f(row.threads_per_process, 'd'):>7} {_f(row.wall_seconds, '.1f'):>7} "
            f"{_f(row.training_seconds, '.1f'):>8} {_f(row.samples_per_sec, ',.0f'):>10} "
            f"{_f(row.speedup, '.2f'):>8} {_f(row.efficiency, '.2f'):>7} "
            f"{_f(row.train_loss, '.4f'):>7} {accuracy:>9}  {row.status.value}"
        )
    return "\n".join(lines)


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


@_for_terminal
def keys_table(keys: KeysPublic) -> str:
    lines = [f"{'id':>4}  {'name':<20} {'role':<7} {'created (UTC)':<19}  {'by':<14} revoked"]
    for key in keys.data:
        revoked = f"{_when(key.revoked_at)} by {key.revoked_by}" if key.revoked_at else "-"
        lines.append(
            f"{key.id:>4}  {key.name:<20} {key.role.value:<7} {_when(key.created_at):<19}  "
            f"{key.created_by or '-':<14} {revoked}"
        )
    return "\n".join(lines)


@_for_terminal
def audit_table(audit: AuditPublic) -> str:
    head = f"{'id':>5}  {'at (UTC)':<19}  {'who':<16} {'from':<15} {'action':<13} "
    lines = [f"{head}{'target':<10} detail"]
    for entry in audit.data:
        detail = " ".join(f"{k}={json.dumps(v)}" for k, v in entry.detail.items())
        lines.append(
            f"{entry.id:>5}  {_when(entry.at):<19}  {entry.actor or '-':<16} "
            f"{entry.address or '-':<15} {entry.action.value:<13} {entry.target:<10} {detail}"
        )
    if audit.next_before is not None:
        lines.append(f"(older entries: --before {audit.next_before})")
    return "\n".join(lines)


def _value(value: Choice) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return one_line(str(value))


@_for_terminal
def sweep_table(sweep: SweepPublic) -> str:
    """One row per trial: its values, state, step and objective; the best
    trial marked with *."""
    names = list(sweep.space)
    objective = f"{sweep.objective.metric} ({sweep.objective.direction})"
    counts = ", ".join(f"{n} {state}" for state, n in sweep.counts.items() if n)
    best = sweep.best
    lines = [
        f"sweep {sweep.id} {sweep.status.value}: {len(sweep.trials)} of {sweep.max_trials} "
        f"trial(s), {sweep.max_concurrent} at a time; {counts or 'none yet'}; "
        f"slot-time {sweep.slot_seconds:,.0f} s",
        f"objective {objective}; sampler {sweep.sampler.kind}; early stopping "
        f"{sweep.pruner.kind}"
        + (
            f"; best: trial {best.number} (job {best.job_id}) {best.value:.6g}"
            if best is not None
            else ""
        ),
        "  ".join(
            [f"{'trial':>6}", f"{'job':>5}"]
            + [f"{one_line(n)[:14]:>14}" for n in names]
            + [f"{'state':<9}", f"{'step':>7}", f"{'value':>10}", f"{'test acc':>8}"]
        ),
    ]
    for trial in sweep.trials:
        mark = "*" if best is not None and trial.number == best.number else " "
        accuracy = f"{100 * trial.test_accuracy:.2f}%" if trial.test_accuracy is not None else "-"
        state = trial.state.value
        if trial.pruned_at_step is not None and trial.state.value == "pruned":
            state = f"pruned@{trial.pruned_at_step}"
        lines.append(
            "  ".join(
                [f"{mark}{trial.number:>5}", f"{trial.job_id:>5}"]
                + [f"{_value(trial.params.get(n, '-'))[:14]:>14}" for n in names]
                + [
                    f"{state:<9}",
                    f"{_f(trial.step, 'd'):>7}",
                    f"{_f(trial.value, '.4g'):>10}",
                    f"{accuracy:>8}",
                ]
            )
        )
    return "\n".join(lines)


@_for_terminal
def sweeps_table(sweeps: SweepsPublic) -> str:
    lines = [f"{'id':>4}  {'status':<10} {'trials':>9}  {'best':>10}  name"]
    for sweep in sweeps.data:
        best = f"{sweep.best.value:.4g}" if sweep.best is not None else "-"
        lines.append(
            f"{sweep.id:>4}  {sweep.status.value:<10} "
            f"{f'{len(sweep.trials)}/{sweep.max_trials}':>9}  {best:>10}  "
            f"{one_line(sweep.name or '')}"
        )
    return "\n".join(lines)
