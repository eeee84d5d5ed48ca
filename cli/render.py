"""How a job looks in a terminal."""

from __future__ import annotations

from api.schemas import JobPublic, StudyPublic


def progress_line(job: JobPublic, width: int = 30) -> str:
    if job.progress is None:
        where = ", ".join(f"m{p.machine_id}@{p.node_name}:{p.status.value}" for p in job.parts)
        detail = job.pending_reason or where or "waiting for nodes"
        return f"job {job.id} {job.status.value:<10} {detail}"
    p = job.progress
    filled = int(width * p.percent / 100)
    bar = "#" * filled + "-" * (width - filled)
    loss = f"{p.loss:.4f}" if p.loss is not None else "-"
    rate = f"{p.samples_per_sec:,.0f}/s" if p.samples_per_sec is not None else "-"
    return (
        f"job {job.id} {job.status.value:<10} [{bar}] {p.percent:5.1f}%  "
        f"epoch {p.epoch}/{p.epochs} batch {p.batch}/{p.batches_per_epoch}  "
        f"loss {loss}  {rate}"
    )


def _s(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "-"


def summary(job: JobPublic) -> str:
    t = job.timing
    topology = job.spec.topology
    lines = [
        f"job {job.id} {job.status.value}: {topology.num_machines} machine(s) x "
        f"{topology.num_processes} process(es), batch {job.spec.batch_size}/process, "
        f"{job.spec.epochs} epoch(s), {job.spec.backend}",
        "timing:",
        f"  queued    {_s(t.queued_seconds)}",
        f"  running   {_s(t.running_seconds)}  (setup {_s(t.setup_seconds)}, "
        f"training {_s(t.training_seconds)}, evaluation {_s(t.eval_seconds)})",
    ]
    for part in job.parts:
        lines.append(f"  machine {part.machine_id} on {part.node_name}: {part.status.value}")
    r = job.result
    if r is not None:
        if r.test_accuracy is not None:
            lines.append(
                f"result: test accuracy {100 * r.test_accuracy:.2f}%, test loss "
                f"{r.test_loss:.4f}, last-epoch train loss {r.train_loss:.4f}"
            )
        if r.samples_per_sec is not None:
            lines.append(f"throughput: {r.samples_per_sec:,.0f} samples/s")
    if job.error is not None:
        e = job.error
        lines.append(f"error ({e.reason}): {e.message}")
        if e.traceback_tail:
            lines.append("  " + e.traceback_tail.strip().replace("\n", "\n  "))
    return "\n".join(lines)


def _f(value: float | None, fmt: str) -> str:
    return format(value, fmt) if value is not None else "-"


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
