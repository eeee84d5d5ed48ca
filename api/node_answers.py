"""What a node's poll and heartbeat are answered, for the routes
(api/routes/nodes.py) and for the lane that answers them before routing
(api/node_lane.py): one place, so both answer alike.

A quiet node (api/quiet_nodes.py) is answered from memory; anything else
reads the database in the thread pool. A poll is held until news for its
node or its deadline."""

from __future__ import annotations

import time

from starlette.concurrency import run_in_threadpool

from api.core import nodes as nodes_core
from api.core.context import Core
from api.notifier import Notifier
from api.quiet_nodes import QuietNodes
from ddpo.schemas import HeartbeatRequest, HeartbeatResponse, PollRequest, PollResponse


async def answer_heartbeat(
    core: Core, quiet: QuietNodes, node_id: int, request: HeartbeatRequest
) -> HeartbeatResponse:
    if quiet.still_quiet(node_id, request.active_part_ids):
        core.sightings.saw(node_id)
        return HeartbeatResponse(stop=[])
    return await run_in_threadpool(nodes_core.heartbeat, core, node_id, request.active_part_ids)


async def answer_poll(
    core: Core, notifier: Notifier, quiet: QuietNodes, node_id: int, request: PollRequest
) -> PollResponse:
    deadline = time.monotonic() + min(request.wait_s, core.settings.poll_wait_s)
    running, waiting = request.active_part_ids, request.waiting_for_port
    asked = frozenset(request.asked_to_stop)
    while True:
        event = notifier.current(node_id, waits_for_port=bool(waiting))
        if not waiting and quiet.still_quiet(node_id, running):
            core.sightings.saw(node_id)
            response = PollResponse(start=[], stop=[], rendezvous=[])
        else:
            stamp = quiet.stamp(node_id)
            response = await run_in_threadpool(
                nodes_core.poll_node, core, node_id, running, waiting, asked
            )
            if not (waiting or _news(response)):
                quiet.heard_nothing(node_id, stamp, running)
        remaining = deadline - time.monotonic()
        if _news(response) or remaining <= 0:
            return response
        if not await notifier.wait(event, remaining):
            # Every write that changes this answer wakes the poll (api/main.py,
            # _wakes_polls): held for its whole wait unwoken, it still stands.
            return response


def _news(response: PollResponse) -> bool:
    return bool(
        response.start or response.stop or response.checkpoint_and_stop or response.rendezvous
    )
