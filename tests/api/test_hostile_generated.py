"""Generated hostility: hypothesis builds JSON bodies, query strings and path
segments around the atoms no well-behaved client sends (numbers beyond a
float, non-finite literals, lone surrogates, NULs, datetimes at the ends of
the calendar, huge integers) and sends them to every route in the route
table, as every role and as nobody. No answer is a 5xx, and every 422 names
a field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api import route_table
from api.route_table import Role
from tests.api.conftest import ProtocolNode, ThreadedServer, bearer, make_settings

TOKENS = {
    Role.ADMIN: "admin-token-generated-hostility-a1",
    Role.USER: "user-token-generated-hostility-b2",
    Role.READER: "read-token-generated-hostility-c3",
    Role.JOIN: "join-token-generated-hostility-d4",
}

# Raw JSON texts json.dumps would never write, and ordinary ones to mix in.
NASTY_JSON = [
    "1e400", "-1e400", "NaN", "Infinity", "-Infinity",
    '"\\ud800"', '"\\udfff x"', '"a\\u0000b"', '"\\u0000"',
    '"9999-12-31T23:59:59-23:59"', '"0001-01-01T00:00:00+23:59"',
    '"2026-13-45T99:99:99Z"', "123456789012345678901234567890", "-9223372036854775809",
    "1e-400", "0.1e99999",
]  # fmt: skip
NASTY_TEXT = [
    "1e400", "NaN", "inf", "-1", "99999999999999999999999", "%00", "%ED%A0%80",
    "%FF%FE", "9999-12-31T23:59:59-23:59", "", "%20", "..%2F..%2Fetc",
]  # fmt: skip
FIELD_NAMES = [
    "name", "epochs", "topology", "num_machines", "num_processes", "batch_size", "lr",
    "node_id", "reports", "lines", "text", "at", "seq", "epoch", "status", "reason",
    "active_part_ids", "wait_s", "master_port", "trainers", "address", "slots", "rows",
    "spec", "offset", "rank", "exit_code", "\\u0000", "\\ud800",
]  # fmt: skip

ordinary = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(json.dumps),
    st.text(max_size=20).map(json.dumps),
    st.booleans().map(json.dumps),
    st.just("null"),
)
atom = st.one_of(st.sampled_from(NASTY_JSON), ordinary)
key = st.one_of(
    st.sampled_from(FIELD_NAMES).map(lambda k: f'"{k}"'), st.text(max_size=8).map(json.dumps)
)
json_text = st.recursive(
    atom,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda items: "[" + ",".join(items) + "]"),
        st.lists(st.tuples(key, inner), max_size=5).map(
            lambda pairs: "{" + ",".join(f"{k}:{v}" for k, v in pairs) + "}"
        ),
    ),
    max_leaves=12,
)
query = st.lists(
    st.tuples(
        st.sampled_from(["limit", "offset", "since", "tail", "status", "state", "rank",
                         "machine_id", "max_points", "epoch", "node_id", "x"]),
        st.sampled_from(NASTY_TEXT),
    ),
    max_size=3,
).map(lambda pairs: "&".join(f"{k}={v}" for k, v in pairs))  # fmt: skip
segment = st.one_of(st.sampled_from(NASTY_TEXT), st.integers(-5, 2**70).map(str))
callers = st.sampled_from([*TOKENS, Role.NODE, None])
routes = st.sampled_from(
    [r for r in route_table.ROUTES if not r.path.startswith(("/ui", "/docs", "/redoc"))]
)


@pytest.fixture(scope="module")
def armed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, ProtocolNode]]:
    """A server with tokens for every role and a node running a part."""
    tmp_path: Path = tmp_path_factory.mktemp("hostile")
    settings_ = make_settings(
        tmp_path,
        poll_wait_s=0,
        artifacts_dir=tmp_path / "artifacts",
        admin_token=TOKENS[Role.ADMIN],
        user_token=TOKENS[Role.USER],
        read_token=TOKENS[Role.READER],
        join_token=TOKENS[Role.JOIN],
    )
    with ThreadedServer(settings_) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        node = ProtocolNode(c, "target", join_token=TOKENS[Role.JOIN])
        c.post("/jobs", json={}, headers=bearer(TOKENS[Role.USER])).raise_for_status()
        assert node.poll()["start"], "the node has a part to report on"
        yield c, node


@settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=routes, caller=callers, body=json_text, params=query, segment=segment)
def test_generated_inputs_to_every_route_as_every_caller_make_no_server_error(
    armed: tuple[httpx.Client, ProtocolNode],
    route: route_table.Route,
    caller: Role | None,
    body: str,
    params: str,
    segment: str,
) -> None:
    client, node = armed
    if route is route_table.REVOKE_NODE and segment == str(node.node_id):
        return  # the node the other examples speak as stays
    path = re.sub(r"\{[^}]+\}", segment, route.path)
    token = node.credential if caller is Role.NODE else TOKENS.get(caller) if caller else None
    headers: dict[str, Any] = {**bearer(token), "content-type": "application/json"}
    if route.upload:
        headers["content-type"] = "application/octet-stream"
    try:
        answer = client.request(
            route.method,
            f"{path}?{params}" if params else path,
            content=body.encode("utf-8", "surrogatepass") if route.method != "GET" else None,
            headers=headers,
        )
    except httpx.InvalidURL:
        return  # the client would not send it
    assert answer.status_code < 500, (route.method, path, params, body, answer.text[:300])
    if answer.status_code == 422:
        detail = answer.json()["detail"]
        assert detail and all(": " in d["msg"] for d in detail), detail
