"""The node daemon: register, then poll the server for parts to start or stop,
supervise their process groups, and ship their progress and outcome.

Nothing is lost while the server is away: progress and finish reports stay
queued on the part until the server takes them, in order.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from ddpo import store
from ddpo.failures import FailureReason
from ddpo.schemas import (
    Assignment,
    NodeRegistered,
    NodeRegistration,
    PartFinished,
    StopRequest,
)
from ddpo.schemas.protocol import TrainerOffer
from worker import cores, fused_pool, network, scripts, trainers
from worker.client import CredentialRefused, NodeUnknown, Refused, ServerClient, ServerUnavailable
from worker.courier import Courier
from worker.forkserver import ForkServer
from worker.heartbeat import Heartbeat
from worker.joining import CannotJoin, count_gpus, join
from worker.part import PartProcess, launcher_env, run_dir_for
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)

# Importing torch takes seconds; on a slow disk, tens of them.
FORK_SERVER_READY_WAIT_S = 60.0

RENDEZVOUS_CHECK_S = 0.1
FINISHING_CHECK_S = 0.1
# Where a retried part keeps the checkpoint it resumes from, in its run directory.
RESUME_FILE = "resume.pt"
# Leaving: beyond the leave and stop graces, for the last reports to go out.
LEAVE_MARGIN_S = 5.0
# The daemon's exit status when the server will not have this node.
EXIT_REFUSED = 3
# ... and when its --address is not this host's.
EXIT_BAD_ADDRESS = 2

Launch = Callable[..., PartProcess]


class Worker:
    """The node's daemon. ``client`` and ``launch`` (how a part's processes
    start) are the real ones unless a test gives its own."""

    def __init__(
        self,
        settings: WorkerSettings,
        client: ServerClient | None = None,
        launch: Launch = PartProcess.launch,
    ) -> None:
        self.settings = settings
        self.client = client or ServerClient(settings.server_url, settings.request_timeout_s)
        self.courier = Courier(self.client)
        self._launch = launch
        self.node_id: int | None = None
        self.parts: dict[int, PartProcess] = {}
        self._exit_requested = False
        self._exit_now = False
        # Shutting down: the parts are stopping at a step; start nothing new.
        self._leaving = False
        self._forks: ForkServer | None = None
        # The fused kernel's build, once per daemon where it is missing.
        self._builder: subprocess.Popen[bytes] | None = None
        self._kernel_settled = False  # built, started, or not to be built
        # What the trainers are, when no fork server told (described once).
        self._offers: list[TrainerOffer] | None = None
        self._forks_awaited = False
        self._heartbeat: Heartbeat | None = None
        # When a poll was last answered (monotonic): the heartbeat skips a
        # beat that would follow one within its interval.
        self._poll_answered_at = float("-inf")
        self._poll_sent_at: float | None = None  # a poll in flight since then
        # Resolved at each registration: the route to the server may change.
        self.network: network.NodeAddress | None = None
        self.cpus = cores.usable_cpus(settings.cpus)

    # --- lifecycle ------------------------------------------------------------

    def run(self) -> int:
        """Serve until asked to stop (0), or until the server refuses this
        node for good (:data:`EXIT_REFUSED`)."""
        self._install_signal_handlers()
        try:
            while not self._exit_requested:
                self.step()
            self._leave()
        except CannotJoin as exc:
            log.error("the server refused this node: %s", exc)
            return EXIT_REFUSED
        except network.AddressNotLocal as exc:
            log.error("cannot serve as a node: %s", exc)
            return EXIT_BAD_ADDRESS
        finally:
            self._shutdown()
        return 0

    def step(self) -> None:
        """One turn: register if not (or no longer) a node, else poll and tend the parts."""
        if self.node_id is None:
            self._register()
        else:
            self._iteration()

    def request_exit(self, *_: object) -> None:
        """Leave (the parts stop at a step, within the leave grace), then
        exit; asked again, exit now."""
        if self._exit_requested:
            self._exit_now = True
        self._exit_requested = True

    def _install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s, stopping", signal.Signals(signum).name)
            self.request_exit()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _register(self) -> None:
        try:
            self.network = network.node_address(
                self.client.url,
                self.settings.address,
                self.settings.interface,
                network.local_addresses(),
            )
        except OSError as exc:  # no route to the server (yet)
            self.courier.unavailable(exc)
            return
        # Ready to fork launchers before offering to run anything: the first
        # job then starts as fast as the next ones.
        self._prewarm()
        if self._forks is not None and not self._forks_awaited:
            self._forks_awaited = True
            if not self._forks.wait_ready(FORK_SERVER_READY_WAIT_S, lambda: self._exit_requested):
                log.warning("the launcher fork server is not ready; launching afresh until it is")
        registration = NodeRegistration(
            name=self.settings.name,
            address=self.network.address,
            slots=self.settings.slots,
            gpus=self.settings.gpus if self.settings.gpus is not None else count_gpus(),
            cpus=self.cpus,
            trainers=self._trainer_offers(),
            scripts=scripts.scan(self.settings.script_dir),
        )
        try:
            registered = join(self.client, self.settings, registration)
        except ServerUnavailable as exc:
            self.courier.unavailable(exc)
            return
        self.courier.available()
        self.node_id = registered.node_id
        log.info(
            "registered as node %d (%s, %s; collectives on %s; %d cpu(s)) with %s",
            self.node_id,
            registration.name,
            registration.address,
            self.network.interface,
            self.cpus,
            self.client.url,
        )
        self._start_heartbeat(registered)

    def _start_heartbeat(self, registered: NodeRegistered) -> None:
        if self._heartbeat is not None:
            self._heartbeat.close()
        self._heartbeat = Heartbeat(
            server_url=self.settings.server_url,  # all of them, if several
            credential=self.client.credential,
            node_id=registered.node_id,
            interval_s=registered.heartbeat_interval_s,
            active_part_ids=lambda: sorted(self.parts),
            stop_parts=self._stop_given_away,
            ask_parts=self._ask_to_stop,
            polled_at=self._polled_at,
        ).start()

    def _polled_at(self) -> float:
        """When the server last had a poll from this daemon: its last answer,
        or the poll it holds now (the server counts a poll as a sign of life
        when it takes it, not when it answers)."""
        sent = self._poll_sent_at
        return self._poll_answered_at if sent is None else max(sent, self._poll_answered_at)

    def _stop_given_away(self, part_ids: list[int]) -> None:
        """The heartbeat's answer: these parts are no longer this node's."""
        for part_id in part_ids:
            part = self.parts.get(part_id)
            if part is not None and not part.stop_requested:
                log.info(
                    "stopping part %d (job %d): the heartbeat says it is not this node's",
                    part_id,
                    part.assignment.job_id,
                )
                part.request_stop()

    def _ask_to_stop(self, requests: list[StopRequest]) -> None:
        """The server asks these parts to stop at a step and checkpoint."""
        for request in requests:
            part = self.parts.get(request.part_id)
            if part is not None:
                part.ask_to_stop(str(request.reason), request.detail, request.grace_s)

    def _trainer_offers(self) -> list[TrainerOffer]:
        """What this node's trainers are: the fork server loaded them already;
        without one, a subprocess does (torch stays out of the daemon)."""
        if self._forks is not None and self._forks.ready() and self._forks.offers is not None:
            return trainers.parse_offers(self._forks.offers)
        if self._offers is None:
            described = subprocess.run(
                [sys.executable, "-m", "worker.trainers", json.dumps(self.settings.trainers)],
                stdout=subprocess.PIPE,
                check=True,
                timeout=300,
            )
            self._offers = trainers.parse_offers(described.stdout.decode())
        return self._offers

    def _prewarm(self) -> None:
        """Start the launcher fork server, or a new one if it died, while the
        node is idle (never while parts run: its imports would take CPU from
        their training); and the fused kernel's build, where it is missing."""
        if self.parts:
            return
        self._build_kernel()
        if not self.settings.prewarm:
            return
        if self._forks is not None and not self._forks.alive():
            self._forks.close()
            self._forks = None
        if self._forks is None:
            self._forks = ForkServer(
                self.settings.data_dir.resolve(),
                self.settings.work_dir.resolve() / "forkserver.log",
                self.settings.trainers,
                env=launcher_env(self.settings),
            )

    def _build_kernel(self) -> None:
        """Compile the built-in trainer's fused max-pool kernel when this
        machine lacks it (once per kernel and torch version, shared by the
        machine's workers): in the background, at idle priority, so a job
        that starts meanwhile keeps its cores and runs aten's ops. Decided
        once per daemon: this runs at every idle poll."""
        if self._builder is not None:
            self._reap_builder()
            return
        if self._kernel_settled:
            return
        self._kernel_settled = True
        directory = self.settings.extensions_dir.resolve()
        if (
            not self.settings.build_extensions
            or not fused_pool.cpu_supports()
            or fused_pool.library(directory).exists()
        ):
            return
        self._extensions_log.parent.mkdir(parents=True, exist_ok=True)
        log.info(
            "compiling the fused max-pool kernel into %s (log: %s)", directory, self._extensions_log
        )
        with open(self._extensions_log, "ab") as out:
            self._builder = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "worker.fused_pool",
                    str(directory),
                    "--idle",
                    "--parent",
                    str(os.getpid()),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=launcher_env(self.settings),
                # Its own group: the compiler it starts goes with it.
                start_new_session=True,
            )

    @property
    def _extensions_log(self) -> Path:
        return self.settings.work_dir.resolve() / "extensions.log"

    def _reap_builder(self) -> None:
        """Say once how the kernel's build ended (and reap it)."""
        assert self._builder is not None
        if self._builder.returncode is not None or self._builder.poll() is None:
            return
        if self._builder.returncode == 0:
            log.info("the fused max-pool kernel is built: jobs from now on use it")
        else:
            log.warning(
                "the fused max-pool kernel was not built (%s): jobs run aten's",
                self._extensions_log,
            )

    def _leave(self) -> None:
        """Asked to exit with parts running: tell the server this node is
        leaving, so their jobs stop at a step, checkpoint and start again
        elsewhere (none fails, none uses a restart); go on tending them
        until they have ended and said so, or the leave grace (and then the
        stop grace) is over, or a second signal comes."""
        grace = self.settings.leave_grace_s
        if self.node_id is None or self._exit_now:
            return
        if not self.parts:
            # Idle, it still says so: until the server would lose it (its
            # heartbeat timeout) a job could be placed on a node that is
            # gone, and fail when the node's next worker registers (a Slurm
            # allocation ending, then the next one starting).
            self._say_leaving(0)
            return
        if grace <= 0:
            return
        if not self._say_leaving(grace):
            return
        log.info("leaving: %d part(s) stop at a step within %g s", len(self.parts), grace)
        self._leaving = True
        deadline = time.monotonic() + grace + self.settings.stop_grace_s + LEAVE_MARGIN_S
        while (
            self.parts
            and self.node_id is not None
            and not self._exit_now
            and time.monotonic() < deadline
        ):
            self._iteration()

    def _say_leaving(self, grace_s: float) -> bool:
        assert self.node_id is not None
        try:
            self.client.leave(self.node_id, grace_s)
        except (ServerUnavailable, Refused) as exc:
            log.warning("could not tell the server this node is leaving: %s", exc)
            return False
        return True

    def _shutdown(self) -> None:
        """Stop every part this node still runs and say so, best effort."""
        for part in self.parts.values():
            part.request_stop()
        deadline = time.monotonic() + self.settings.stop_grace_s + 5
        while self.parts and time.monotonic() < deadline:
            for part_id, part in list(self.parts.items()):
                part.enforce_stop(self.settings.stop_grace_s)
                if part.has_ended():
                    self._report_shutdown(part_id)
                    del self.parts[part_id]
            time.sleep(0.1)
        if self._heartbeat is not None:
            self._heartbeat.close()
        if self._forks is not None:
            self._forks.close()
        if self._builder is not None and self._builder.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._builder.pid, signal.SIGKILL)  # the next start builds again
            self._builder.wait()
        self.client.close()
        log.info("worker %s stopped", self.settings.name)

    def _report_shutdown(self, part_id: int) -> None:
        if self.node_id is None:
            return
        report = PartFinished(
            node_id=self.node_id,
            status="failed",
            reason=FailureReason.WORKER_SHUTDOWN,
            message=f"worker {self.settings.name} shut down while the part ran",
        )
        try:
            self.client.finish(part_id, report)
        except (ServerUnavailable, Refused) as exc:
            log.warning("could not report part %d stopped at shutdown: %s", part_id, exc)

    # --- one turn of the loop -------------------------------------------------

    def _iteration(self) -> None:
        assert self.node_id is not None
        self._tend_parts()
        wait = self._poll_wait()
        waiting_for_port = sorted(
            part_id
            for part_id, p in self.parts.items()
            if p.assignment.machine_id > 0 and p.waits_for_port
        )
        self._poll_sent_at = time.monotonic()
        try:
            response = self.client.poll(
                self.node_id,
                sorted(self.parts),
                waiting_for_port,
                wait,
                asked_to_stop=sorted(i for i, p in self.parts.items() if p.asked_to_stop),
            )
        except NodeUnknown:
            log.warning("server no longer knows node %d; registering again", self.node_id)
            self.node_id = None
            return
        except CredentialRefused:
            log.warning("server refused node %d's credential; registering again", self.node_id)
            self.node_id = None
            return
        except Refused as exc:
            raise CannotJoin(str(exc)) from None
        except ServerUnavailable as exc:
            self.courier.unavailable(exc)
            return
        finally:
            self._poll_sent_at = None  # taken and answered, or not taken at all
        self._poll_answered_at = time.monotonic()
        self.courier.available()
        for assignment in response.start if not self._leaving else ():
            self._start(assignment)
        for part_id in response.stop:
            self._stop(part_id)
        self._ask_to_stop(response.checkpoint_and_stop)
        for rendezvous in response.rendezvous:
            part = self.parts.get(rendezvous.part_id)
            if part is not None:
                part.learn_port(rendezvous.master_port)
        self._tend_parts()

    def _poll_wait(self) -> float:
        """How long the poll may wait for news: less while parts need tending."""
        wait = self.settings.poll_wait_s
        if self.parts:
            # Come back soon enough to ship progress and notice exits.
            wait = min(wait, self.settings.report_interval_s)
        if any(p.assignment.machine_id == 0 and p.waits_for_port for p in self.parts.values()):
            # Peers wait for the port machine 0's launcher is about to bind.
            wait = min(wait, RENDEZVOUS_CHECK_S)
        if any(p.outbox.training_done for p in self.parts.values()):
            # A part about to end: report it (and free the node) promptly.
            wait = min(wait, FINISHING_CHECK_S)
        for part in self.parts.values():
            # Back when its training should end, not up to a wait after.
            left = part.outbox.seconds_left()
            if left is not None:
                wait = min(wait, max(FINISHING_CHECK_S, left))
        return wait

    def _start(self, assignment: Assignment) -> None:
        assert self.node_id is not None
        if assignment.part_id in self.parts:
            return
        log.info(
            "starting job %d machine %d (part %d): %d process(es), rendezvous at %s:%s",
            assignment.job_id,
            assignment.machine_id,
            assignment.part_id,
            assignment.spec.topology.num_processes,
            assignment.master_addr,
            assignment.master_port or "(port to come)",
        )
        with_run = self._with_tracking_run(assignment)
        if with_run is None:
            return  # the next poll hands the part out again
        assignment = with_run
        resume_from = None
        if assignment.resume_epoch is not None:
            # A retry: every machine continues from the job's last checkpoint.
            resume_from = run_dir_for(self.settings.work_dir.resolve(), assignment) / RESUME_FILE
            try:
                resume_from.parent.mkdir(parents=True, exist_ok=True)
                self._fetch_checkpoint(assignment, resume_from)
            except ServerUnavailable as exc:
                log.warning("checkpoint for part %d not fetched yet: %s", assignment.part_id, exc)
                return  # the next poll hands the part out again
            except (Refused, OSError, store.StoreError) as exc:
                self._launch_failed(
                    assignment.part_id,
                    f"fetch the checkpoint of epoch {assignment.resume_epoch}: {exc}",
                )
                return
        try:
            assert self.network is not None
            part = self._launch(
                assignment,
                self.settings,
                interface=self.network.interface,
                cpus=self.cpus,
                forks=self._forks,
                resume_from=resume_from,
            )
        except OSError as exc:
            self._launch_failed(assignment.part_id, f"launch the part: {exc}")
            return
        self.parts[assignment.part_id] = part
        try:
            if not self.client.started(assignment.part_id, self.node_id):
                log.info("part %d was withdrawn while starting; stopping it", assignment.part_id)
                part.request_stop()
        except ServerUnavailable as exc:
            # The finish report moves it along later; the poll keeps it honest.
            log.warning("could not report part %d started: %s", assignment.part_id, exc)
        except Refused as exc:
            log.warning("start of part %d refused: %s", assignment.part_id, exc)
            part.request_stop()

    def _launch_failed(self, part_id: int, could_not: str) -> None:
        assert self.node_id is not None
        log.error("part %d: could not %s", part_id, could_not)
        self._send_finish(
            part_id,
            PartFinished(
                node_id=self.node_id,
                status="failed",
                reason=FailureReason.LAUNCH_FAILED,
                message=f"worker {self.settings.name} could not {could_not}",
            ),
        )

    def _stop(self, part_id: int) -> None:
        assert self.node_id is not None
        part = self.parts.get(part_id)
        if part is None:
            # Nothing runs here for it: confirm, so the server can settle it.
            self._send_finish(
                part_id,
                PartFinished(
                    node_id=self.node_id,
                    status="cancelled",
                    message="stopped before it started on this node",
                ),
            )
            return
        if not part.stop_requested:
            log.info("stopping part %d (job %d)", part_id, part.assignment.job_id)
        part.request_stop()

    def _with_tracking_run(self, assignment: Assignment) -> Assignment | None:
        """The assignment with its job's MLflow run, for the ranks'
        environment, asked of the server if it has none yet; None: the
        server cannot be reached now."""
        if assignment.tracking is None or assignment.tracking.run_id is not None:
            return assignment
        assert self.node_id is not None
        try:
            run = self.client.tracking_run(assignment.part_id, self.node_id)
        except ServerUnavailable as exc:
            log.warning("MLflow run for part %d not known yet: %s", assignment.part_id, exc)
            return None
        except Refused as exc:
            log.warning("part %d runs without its MLflow run: %s", assignment.part_id, exc)
            return assignment
        return assignment.model_copy(update={"tracking": run})

    def _fetch_checkpoint(self, assignment: Assignment, destination: Path) -> None:
        """A retry's checkpoint: from the artifact store when it holds it and
        this node can read it, else through the server; its digest checked
        either way (store.DigestMismatch: the copy kept is damaged)."""
        kept = assignment.resume_object
        if kept is not None:
            began = time.monotonic()
            try:
                size = store.fetch(kept.url, destination, kept.sha256)
                log.info(
                    "part %d: checkpoint of epoch %s read from the artifact store "
                    "(%d bytes) in %.1f s",
                    assignment.part_id,
                    assignment.resume_epoch,
                    size,
                    time.monotonic() - began,
                )
                return
            except store.DigestMismatch:
                raise
            except Exception as exc:  # any library's failure (botocore, aiohttp): fall back
                log.warning(
                    "part %d: checkpoint not read from the artifact store (%s: %s); "
                    "fetching it through the server",
                    assignment.part_id,
                    type(exc).__name__,
                    exc,
                )
        self.client.download_checkpoint(assignment.job_id, destination)

    def _tend_parts(self) -> None:
        """Enforce stop deadlines, publish machine 0's port, deliver each
        part's outbox, and let go of the parts whose finish is delivered."""
        assert self.node_id is not None
        for part_id, part in list(self.parts.items()):
            part.enforce_stop(self.settings.stop_grace_s)
            if part.assignment.machine_id == 0 and part.waits_for_port:
                self._publish_port(part_id, part)
            finish = part.final_report(self.node_id) if part.has_ended() else None
            if part.outbox.deliver(self.courier, self.node_id, finish):
                assert finish is not None
                log.info(
                    "part %d (job %d machine %d) %s",
                    part_id,
                    part.assignment.job_id,
                    part.assignment.machine_id,
                    finish.status,
                )
                del self.parts[part_id]
        self._prewarm()

    def _publish_port(self, part_id: int, part: PartProcess) -> None:
        assert self.node_id is not None
        node_id, port = self.node_id, part.bound_port()
        if port is not None and self.courier.deliver(
            f"rendezvous of part {part_id}",
            lambda: self.client.rendezvous(part_id, node_id, port),
        ):
            part.port_published()

    def _send_finish(self, part_id: int, report: PartFinished) -> bool:
        """True once the server has the report (or refused it for good)."""
        return self.courier.deliver(
            f"finish of part {part_id}", lambda: self.client.finish(part_id, report)
        )
