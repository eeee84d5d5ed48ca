"""``ddpo submit | list | show | logs | cancel | priority | queue | nodes``: the server's API from
a terminal. Human-readable by default, ``--json`` for scripts (the API's own
JSON, unchanged)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import webbrowser
from typing import Any
from urllib.parse import quote

from cli import render
from cli.api import DEFAULT_SERVER, Api, CliError, Unreachable, server_url, token_for
from cli.jobs import add_spec_arguments, follow, spec_from_args, submit_once
from cli.terminal import shown
from ddpo.lifecycle import JobStatus, NodeState
from ddpo.schemas import (
    JobPublic,
    JobsPublic,
    LogLinePublic,
    NodePublic,
    NodesPublic,
)
from ddpo.schemas.public import QueuePublic, TrainersPublic

ENVIRONMENT = (
    "Environment: DDPO_SERVER, the server's URL (default "
    f"{DEFAULT_SERVER}, or the cluster `ddpo local-cluster --keep` keeps on this host); "
    "DDPO_TOKEN, the bearer token presented (your own key, from `ddpo keys create`; or a "
    "role's token: the server's DDPO_USER_TOKEN to submit and cancel, DDPO_READ_TOKEN to "
    "look); unset, the kept "
    "cluster's, or the admin token a server on this host made for itself."
)


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """Each flag's default in its help, unless there is none to show or the
    help already says it in its own words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        said = action.help or ""
        if action.default in (None, False) or "%(default)" in said or "(default " in said:
            return action.help
        return super()._get_help_string(action)


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = ENVIRONMENT
    parser.formatter_class = DefaultsShown
    # SUPPRESS: a --server given before the subcommand is not overwritten.
    parser.add_argument(
        "--server",
        default=argparse.SUPPRESS,
        help=f"the ddpo server [DDPO_SERVER, default {DEFAULT_SERVER}]; a missing http:// is added",
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON")


def client_for(args: argparse.Namespace) -> Api:
    """A client of the server, presenting $DDPO_TOKEN (or the kept local
    cluster's user token)."""
    url = server_url(getattr(args, "server", None))
    return Api(url, token_for(url))


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


# --- submit -------------------------------------------------------------------


def add_submit(commands: Any) -> None:
    parser = commands.add_parser("submit", help="submit a job", description="Submit a job.")
    add_connection_arguments(parser)
    parser.add_argument(
        "--wait",
        action="store_true",
        help="follow it with a progress bar; exit 0 if it succeeds, 1 if not",
    )
    parser.add_argument(
        "--idempotency-key",
        help="submitting again with the same key returns the same job, never a second one",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print the job's id alone (JOB=$(ddpo submit -q ...)); with --wait, nothing "
        "until the end",
    )
    add_spec_arguments(parser)
    parser.set_defaults(run=run_submit)


def run_submit(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        job, new = submit_once(api, spec_from_args(args), args.idempotency_key)
        said = (
            f"submitted job {job.id}"
            if new
            else f"job {job.id} has this Idempotency-Key already (the same spec): not "
            "submitted again"
        )
        if args.quiet:
            print(job.id, flush=True)
        if not args.wait:
            if args.json:
                _print_json(job.model_dump(mode="json"))
            elif not args.quiet:
                why = f": {job.pending_reason}" if job.pending_reason else ""
                print(shown(f"{said} ({job.status.value}{why})"))
            return 0
        if not args.json and not args.quiet:
            print(said, flush=True)
        try:
            with contextlib.ExitStack() as stack:
                watching = (
                    stack.enter_context(open(os.devnull, "w"))
                    if args.quiet
                    else sys.stderr
                    if args.json
                    else sys.stdout
                )
                job = follow(api, job.id, out=watching)
        except KeyboardInterrupt:
            # Ctrl-C stops the watching, not the job: say how to do either.
            print(
                f"\nstopped watching job {job.id}; it goes on on the server. "
                f"`ddpo cancel {job.id}` cancels it; `ddpo logs -f {job.id}` or "
                f"`ddpo show {job.id}` watches it again",
                file=sys.stderr,
                flush=True,
            )
            return 130
    if args.json:
        _print_json(job.model_dump(mode="json"))
    elif not args.quiet:
        print(render.summary(job))
    return 0 if job.status is JobStatus.SUCCEEDED else 1


# --- list, show, cancel ------------------------------------------------------------


def add_list(commands: Any) -> None:
    parser = commands.add_parser("list", help="list jobs, newest first")
    add_connection_arguments(parser)
    parser.add_argument(
        "--status", choices=[s.value for s in JobStatus], help="only jobs in this state"
    )
    parser.add_argument("--limit", type=int, default=20, help="at most this many")
    parser.set_defaults(run=run_list)


def run_list(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        data = api.get("/jobs", "list jobs", status=args.status, limit=args.limit)
    if args.json:
        _print_json(data)
    else:
        print(render.jobs_table(JobsPublic.model_validate(data)))
    return 0


def add_show(commands: Any) -> None:
    parser = commands.add_parser("show", help="one job: progress, timing, result, error")
    add_connection_arguments(parser)
    parser.add_argument("job_id", type=int, help="the job's id")
    parser.set_defaults(run=run_show)


def run_show(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        data = api.get(f"/jobs/{args.job_id}", f"show job {args.job_id}")
    if args.json:
        _print_json(data)
    else:
        job = JobPublic.model_validate(data)
        print(render.progress_line(job))
        print(render.summary(job))
    return 0


def add_cancel(commands: Any) -> None:
    parser = commands.add_parser("cancel", help="cancel jobs (their ranks stop on every node)")
    add_connection_arguments(parser)
    parser.add_argument("job_ids", type=int, nargs="+", metavar="job_id", help="the jobs' ids")
    parser.set_defaults(run=run_cancel)


def run_cancel(args: argparse.Namespace) -> int:
    """Each job in turn; one that cannot be cancelled (not found, not
    yours, ended) is said, and the rest are still cancelled."""
    refused: list[str] = []
    cancelled: list[Any] = []
    with client_for(args) as api:
        for job_id in args.job_ids:
            try:
                response = api.post(f"/jobs/{job_id}/cancel", f"cancel job {job_id}")
            except CliError as exc:
                if isinstance(exc, Unreachable) or len(args.job_ids) == 1:
                    raise  # the one line that says it all
                refused.append(str(exc))
                print(shown(f"ddpo {exc}"), file=sys.stderr)
                continue
            if args.json:
                cancelled.append(response.json())
            else:
                job = JobPublic.model_validate(response.json())
                print(f"job {job.id} {job.status.value}")
    if args.json:
        _print_json(cancelled[0] if len(args.job_ids) == 1 and cancelled else cancelled)
    if refused:
        raise CliError(f"{len(refused)} of {len(args.job_ids)} job(s) not cancelled")
    return 0


def add_queue(commands: Any) -> None:
    parser = commands.add_parser(
        "queue", help="queued jobs in the order they are tried, and why each waits"
    )
    add_connection_arguments(parser)
    parser.set_defaults(run=run_queue)


def run_queue(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        data = api.get("/queue", "read the queue")
    if args.json:
        _print_json(data)
    else:
        print(render.queue_table(QueuePublic.model_validate(data)))
    return 0


def add_priority(commands: Any) -> None:
    parser = commands.add_parser(
        "priority", help="change a queued job's priority (higher starts first)"
    )
    add_connection_arguments(parser)
    parser.add_argument("job_id", type=int, help="the job's id")
    parser.add_argument("priority", type=int, help="-1000 to 1000; the default is 0")
    parser.set_defaults(run=run_priority)


def run_priority(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        response = api.request(
            "PATCH",
            f"/jobs/{args.job_id}",
            f"change job {args.job_id}'s priority",
            json={"priority": args.priority},
        )
    if args.json:
        _print_json(response.json())
    else:
        job = JobPublic.model_validate(response.json())
        why = f": {job.pending_reason}" if job.pending_reason else ""
        print(shown(f"job {job.id}: priority {job.priority} ({job.status.value}{why})"))
    return 0


# --- logs ---------------------------------------------------------------------------


def add_logs(commands: Any) -> None:
    parser = commands.add_parser(
        "logs", help="what a job's ranks printed", description="What a job's ranks printed."
    )
    add_connection_arguments(parser)
    parser.add_argument("job_id", type=int, help="the job's id")
    parser.add_argument("--rank", type=int, help="one global rank only")
    parser.add_argument("--machine", type=int, help="one machine id only")
    parser.add_argument("--tail", type=int, help="only the last N lines")
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the job ends"
    )
    parser.set_defaults(run=run_logs)


def _log_line(line: LogLinePublic, prefixed: bool) -> str:
    if not prefixed:
        return shown(line.text)
    source = f"rank {line.rank}" if line.rank is not None else "launcher"
    return shown(f"[m{line.machine_id} {source}] {line.text}")


def _check_rank(api: Api, job_id: int, rank: int) -> None:
    """Nothing printed for a rank: say so if the job has no such rank."""
    job = JobPublic.model_validate(api.get(f"/jobs/{job_id}", f"job {job_id}"))
    if rank >= job.world_size:
        raise CliError(f"--rank: job {job_id} has ranks 0 to {job.world_size - 1}")


def run_logs(args: argparse.Namespace) -> int:
    prefixed = args.rank is None  # one rank's lines need no label
    with client_for(args) as api, api.doing(f"logs of job {args.job_id}") as client:
        if args.follow:
            # Reachable, allowed, and a job: only then is a dropped stream
            # worth waiting out (the client does, and resumes after the last line).
            client.get(args.job_id)
            client.say = lambda message: print(message, file=sys.stderr, flush=True)
        lines = client.logs(
            args.job_id,
            follow=args.follow,
            machine_id=args.machine,
            rank=args.rank,
            tail=args.tail,
        )
        printed = False
        for line in lines:
            printed = True
            print(line.model_dump_json() if args.json else _log_line(line, prefixed), flush=True)
        if not printed and args.rank is not None:
            _check_rank(api, args.job_id, args.rank)
    return 0


# --- nodes ----------------------------------------------------------------------------


def add_nodes(commands: Any) -> None:
    parser = commands.add_parser("nodes", help="worker nodes: state, heartbeat, what they run")
    add_connection_arguments(parser)
    parser.add_argument(
        "--state", choices=[s.value for s in NodeState], help="only nodes in this state"
    )
    parser.add_argument("--limit", type=int, default=100, help="at most this many, oldest first")
    parser.add_argument("--offset", type=int, default=0, help="skip this many first")
    parser.set_defaults(run=run_nodes)


def run_nodes(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        data = api.get(
            "/nodes", "list nodes", state=args.state, limit=args.limit, offset=args.offset
        )
    if args.json:
        _print_json(data)
    else:
        print(render.nodes_table(NodesPublic.model_validate(data)))
    return 0


def add_drain(commands: Any) -> None:
    parser = commands.add_parser(
        "drain",
        help="take a node out of service: no new part; its jobs stop at a step and move",
        description="The node takes no new part. Its parts run until the deadline, then "
        "their jobs stop at a step, checkpoint, and start again on other nodes from that "
        "step, using none of their restarts. Admins only.",
    )
    add_connection_arguments(parser)
    parser.add_argument("node", help="the node's id or name")
    parser.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="let its parts run this long first (default 0: stop them at once)",
    )
    parser.set_defaults(run=run_drain)


def add_undrain(commands: Any) -> None:
    parser = commands.add_parser("undrain", help="put a drained node back in service")
    add_connection_arguments(parser)
    parser.add_argument("node", help="the node's id or name")
    parser.set_defaults(run=run_undrain)


def _node_id(api: Any, node: str) -> int:
    """A node's id, from its id or its name."""
    if node.isdigit():
        return int(node)
    found = api.get("/nodes", "find the node", limit=500)["data"]
    ids = [n["id"] for n in found if n["name"] == node]
    if not ids:
        raise CliError(f"no node named {node!r} (ddpo nodes lists them)")
    return int(ids[0])


def run_drain(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        node_id = _node_id(api, args.node)
        response = api.post(
            f"/nodes/{node_id}/drain", f"drain node {args.node}", json={"deadline_s": args.deadline}
        )
    return _said_of_node(args, response.json())


def run_undrain(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        node_id = _node_id(api, args.node)
        response = api.post(f"/nodes/{node_id}/undrain", f"undrain node {args.node}")
    return _said_of_node(args, response.json())


def _said_of_node(args: argparse.Namespace, data: Any) -> int:
    if args.json:
        _print_json(data)
    else:
        node = NodePublic.model_validate(data)
        print(shown(f"node {node.id} ({node.name}): {render.node_state(node)}"))
    return 0


# --- model ---------------------------------------------------------------------


def add_model(commands: Any) -> None:
    parser = commands.add_parser(
        "model",
        help="download a job's model (its newest checkpoint) to a file",
        description="Download a job's newest checkpoint: after a succeeded job, its final "
        'model. torch.load(FILE)["model"] is the state_dict; the file also holds the '
        "optimizer, epoch and step a run resumes from.",
    )
    add_connection_arguments(parser)
    parser.add_argument("job_id", type=int, help="the job's id")
    parser.add_argument(
        "-o", "--output", help="where to write it (default: job-ID.pt here)", default=None
    )
    parser.set_defaults(run=run_model)


def run_model(args: argparse.Namespace) -> int:
    target = args.output or f"job-{args.job_id}.pt"
    with client_for(args) as api, api.doing(f"model of job {args.job_id}") as client:
        written = client.download_model(args.job_id, target)
    size = written.stat().st_size
    if args.json:
        _print_json({"job_id": args.job_id, "path": str(written), "bytes": size})
    else:
        print(shown(f"job {args.job_id}'s model: {written} ({size / 1e6:.1f} MB)"))
    return 0


# --- trainers -------------------------------------------------------------------


def add_trainers(commands: Any) -> None:
    parser = commands.add_parser(
        "trainers", help="what the live nodes can run: trainers with their params, scripts"
    )
    add_connection_arguments(parser)
    parser.set_defaults(run=run_trainers)


def run_trainers(args: argparse.Namespace) -> int:
    with client_for(args) as api:
        data = api.get("/trainers", "list trainers")
    if args.json:
        _print_json(data)
    else:
        print(render.trainers_table(TrainersPublic.model_validate(data)))
    return 0


# --- dashboard ----------------------------------------------------------------


def add_dashboard(commands: Any) -> None:
    parser = commands.add_parser(
        "dashboard",
        help="print the dashboard's address, with the token this CLI uses (and open it)",
    )
    add_connection_arguments(parser)
    parser.add_argument("--open", action="store_true", help="open it in the default browser")
    parser.set_defaults(run=run_dashboard)


def run_dashboard(args: argparse.Namespace) -> int:
    """The token travels in the address's fragment, which a browser never
    sends: the page keeps it in its own storage and drops it from the address."""
    url = server_url(getattr(args, "server", None))
    token = token_for(url)
    link = f"{url}/ui" + (f"#token={quote(token, safe='')}" if token else "")
    if args.json:
        _print_json({"url": link})
    else:
        print(link)
    if args.open:
        webbrowser.open(link)
    return 0
