"""``ddpo local-cluster``: a server and K workers on this machine, one job
through them, its progress while it runs and its timing when it ends."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from cli import render
from cli.cluster import LocalCluster, StateDirInUse, port_free
from cli.hosts import HostsUnavailable, TestHosts
from cli.jobs import add_spec_arguments, follow, spec_from_args, submit
from cli.studies import add_study_arguments, run_study, study_request
from ddpo import kept

# Where a kept cluster's server listens: README's examples say localhost:8000.
KEPT_PORT = 8000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers", type=int, default=None, help="worker daemons to start (default: --machines)"
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("DDPO_DATA_DIR", "./data")),
        help="datasets directory; MNIST is downloaded there if absent "
        "[DDPO_DATA_DIR, default ./data]",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path("./local-cluster"),
        help="database, logs and run directories (default ./local-cluster)",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"server port (default {KEPT_PORT} with --keep, else a free one)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help=f"start the cluster and keep it until Ctrl-C, running no job: the server on "
        f"127.0.0.1:{KEPT_PORT}, as README's examples assume; ddpo on this host then uses "
        "it without DDPO_SERVER or DDPO_TOKEN (its address and user token are in "
        "$DDPO_CLUSTER_FILE, default ~/.local/state/ddpo/cluster.json, mode 0600)",
    )
    parser.add_argument(
        "--study",
        action="store_true",
        help="run a scaling study (see --rows) instead of one job, and print its table",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the job's (or study's) JSON at the end"
    )
    parser.add_argument(
        "--hosts",
        action="store_true",
        help="put the server and each worker on a test host of its own: a network "
        "namespace with its own address on a bridge, as the multi-host tests do "
        "(root and iproute2; each worker declares its share of this machine's cores)",
    )
    parser.add_argument(
        "--link-mbit",
        type=float,
        help="with --hosts: limit each worker's link to this many Mbit/s (tc tbf)",
    )
    parser.add_argument(
        "--script-dir",
        type=Path,
        default=Path(os.environ["DDPO_SCRIPT_DIR"]) if os.environ.get("DDPO_SCRIPT_DIR") else None,
        help="a directory of torchrun-style scripts the workers offer to jobs (a relative "
        "path is taken from here) [DDPO_SCRIPT_DIR]",
    )
    add_study_arguments(parser)
    add_spec_arguments(parser)


def script_dir_args(given: Path | None) -> list[str]:
    """The workers' --script-dir: absolute (they run elsewhere), and there."""
    if given is None:
        return []
    where = given.expanduser().resolve()
    if not where.is_dir():
        raise SystemExit(f"--script-dir: {given} ({where}) is not a directory")
    return ["--script-dir", str(where)]


def run(args: argparse.Namespace) -> int:
    workers = args.workers if args.workers is not None else args.machines
    if args.link_mbit is not None and not args.hosts:
        raise SystemExit("--link-mbit: only with --hosts")
    with contextlib.ExitStack() as stack:
        hosts = None
        if args.hosts:
            hosts = TestHosts(["server", *(f"node-{i}" for i in range(workers))])
            try:
                stack.enter_context(hosts)
            except HostsUnavailable as exc:
                raise SystemExit(f"--hosts: {exc}") from None
            for name in hosts.names[1:]:
                if args.link_mbit is not None:
                    hosts.limit_rate(name, args.link_mbit)
                print(f"test host {name} at {hosts.address(name)}", flush=True)
        port = args.port if args.port is not None else (KEPT_PORT if args.keep else 0)
        if args.keep and args.port is None and not port_free(port):
            raise SystemExit(
                f"--keep: port {port} on 127.0.0.1 is taken (another ddpo server?); "
                "stop it, or pick another with --port"
            )
        cluster = LocalCluster(
            state_dir=args.state_dir,
            data_dir=args.data_dir,
            workers=workers,
            port=port,
            hosts=hosts,
            worker_args=script_dir_args(args.script_dir),
        )
        try:
            return _run_on(cluster, args, workers)
        except StateDirInUse as exc:
            raise SystemExit(f"--state-dir: {exc}") from None


def _run_on(cluster: LocalCluster, args: argparse.Namespace, workers: int) -> int:
    # With --json, stdout carries the API's JSON alone; people's lines go to stderr.
    out = sys.stderr if args.json else sys.stdout

    def say(line: str) -> None:
        print(line, file=out, flush=True)

    say(f"starting a server and {workers} worker(s) in {args.state_dir} ...")
    started = time.monotonic()
    with cluster:
        say(f"database, logs and run directories in {cluster.state_dir}")
        if args.keep:
            say(f"server at {cluster.url}, dashboard at {cluster.url}/ui/jobs")
            say(how_to_use_tokens(cluster))
            return _keep(cluster)
        # Gone when the job ends: --keep is the cluster to use by hand.
        say(
            f"dashboard at {cluster.url}/ui/jobs while this runs (its tokens: "
            f"{cluster.tokens_file}); --keep keeps a cluster for the CLI and curl"
        )
        with cluster.api() as api:
            if args.study:
                study = run_study(api, study_request(args), out=out)
                print(study.model_dump_json(indent=2) if args.json else render.study_table(study))
                return 0 if study.status.value == "succeeded" else 1
            job = submit(api, spec_from_args(args))
            say(f"submitted job {job.id}")
            try:
                job = follow(api, job.id, out=out)
            except KeyboardInterrupt:
                say(f"\ncancelling job {job.id} ...")
                api.post(f"/jobs/{job.id}/cancel", f"cancel job {job.id}")
                job = follow(api, job.id, out=out)
        if args.json:
            print(job.model_dump_json(indent=2))
        else:
            print(render.summary(job))
        say(f"wall time, cluster start to job end: {time.monotonic() - started:.1f} s")
    return 0 if job.status.value == "succeeded" else 1


def _keep(cluster: LocalCluster) -> int:
    """Serve until Ctrl-C (or SIGTERM), or until the server dies."""
    assert cluster.server is not None
    token = cluster.tokens.user if cluster.tokens else None
    where = kept.write(kept.KeptCluster(server=cluster.url, token=token, pid=os.getpid()))
    print(
        f"kept until Ctrl-C; ddpo on this host uses it by itself ({where}): try `ddpo nodes`",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: _interrupt())
    # Ctrl-C stops it even when started from a shell that had SIGINT ignored
    # (a script's background job): that is what the line above promises.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while cluster.server.process.poll() is None:
            time.sleep(0.5)
        print(f"the server exited with code {cluster.server.process.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping the cluster ...", flush=True)
        return 0
    finally:
        kept.remove(os.getpid())


def _interrupt() -> None:
    raise KeyboardInterrupt


def how_to_use_tokens(cluster: LocalCluster) -> str:
    """Where this run's tokens are and how to present them; the tokens
    themselves stay out of the terminal (and of anything that records it)."""
    tokens = cluster.tokens_file
    return "\n".join(
        [
            f"this run's tokens are in {tokens} (only you can read it); to use them:",
            f"  source {tokens}    # DDPO_SERVER and DDPO_TOKEN for ddpo submit/list/show/cancel",
            f'  curl -H "Authorization: Bearer $DDPO_TOKEN" {cluster.url}/jobs',
            "  the dashboard asks once for a token: DDPO_READ_TOKEN (reads) or DDPO_TOKEN",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ddpo local-cluster")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
