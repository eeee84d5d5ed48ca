"""What users get from the jobs API: validation, lookups, listing, cancel."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest


def submit(client: httpx.Client, **spec: Any) -> dict[str, Any]:
    response = client.post("/jobs", json=spec)
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


def test_submit_answers_201_with_the_stored_job(client: httpx.Client) -> None:
    job = submit(client, name="first", topology={"num_machines": 2, "num_processes": 1}, epochs=2)
    assert job["id"] >= 1 and job["status"] == "queued"
    assert job["spec"]["topology"] == {"num_machines": 2, "num_processes": 1}
    assert job["spec"]["epochs"] == 2 and job["world_size"] == 2
    assert "needs 2 live node(s)" in job["pending_reason"]
    assert client.get(f"/jobs/{job['id']}").json()["spec"] == job["spec"]


@pytest.mark.parametrize(
    "body,field",
    [
        ({"topology": {"num_machines": 0, "num_processes": 1}}, "topology.num_machines"),
        ({"topology": {"num_machines": 1, "num_processes": -2}}, "topology.num_processes"),
        ({"topology": {"num_machines": 64, "num_processes": 64}}, "topology"),
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": "many"}, "batch_size"),
        ({"epochs": -1}, "epochs"),
        ({"backend": "mpi"}, "backend"),
        ({"lr": -0.5}, "lr"),
        ({"unknown_field": True}, "unknown_field"),
        ({"topology": {"machines": 2}}, "topology.machines"),
        # No code from the wire: a trainer is a name the workers already know.
        ({"trainer": "os.system('x')"}, "trainer"),
        ({"trainer": "worker.mnist:train"}, "trainer"),
        ({"trainer": "../../bin/sh"}, "trainer"),
        ({"code": "import os"}, "code"),
        ({"name": "x" * 129}, "name"),
        ({"performance": {"precision": "fp8"}}, "performance.precision"),
        # fp16 needs a GPU: the message goes on "precision: fp16-mixed runs on GPUs".
        ({"performance": {"precision": "fp16-mixed"}}, "performance"),
    ],
)
def test_invalid_specs_get_422_naming_the_field(
    client: httpx.Client, body: dict[str, Any], field: str
) -> None:
    response = client.post("/jobs", json=body)
    assert response.status_code == 422
    messages = [d["msg"] for d in response.json()["detail"]]
    assert any(m.startswith(f"{field}: ") for m in messages), messages
    assert client.get("/jobs").json()["count"] == 0


@pytest.mark.parametrize(
    "body,said",
    [
        ({"performance": {"channel_last": True}}, "performance.channel_last: "),
        ({"topology": {"num_machine": 2}}, "topology.num_machine: "),
        ({"epoch": 2}, "epoch: "),
    ],
)
def test_a_mistyped_field_gets_the_nearest_known_one_suggested(
    client: httpx.Client, body: dict[str, Any], said: str
) -> None:
    response = client.post("/jobs", json=body)
    assert response.status_code == 422, response.text
    (message,) = [d["msg"] for d in response.json()["detail"]]
    meant = {"performance": "channels_last", "topology": "num_machines", "epoch": "epochs"}
    assert message.startswith(said) and f"(did you mean {meant[next(iter(body))]}?)" in message


def test_a_field_near_nothing_known_gets_no_suggestion(client: httpx.Client) -> None:
    response = client.post("/jobs", json={"performance": {"zzzz": 1}})
    (message,) = [d["msg"] for d in response.json()["detail"]]
    assert message.startswith("performance.zzzz: ") and "did you mean" not in message


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b"null"])
def test_bodies_that_are_not_a_spec_get_422(client: httpx.Client, content: bytes) -> None:
    response = client.post("/jobs", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422


@pytest.mark.parametrize(
    "method,path",
    [("GET", "/jobs/999"), ("POST", "/jobs/999/cancel"), ("GET", "/jobs/999/metrics")],
)
def test_unknown_jobs_get_404(client: httpx.Client, method: str, path: str) -> None:
    response = client.request(method, path)
    assert response.status_code == 404
    assert response.json()["detail"] == "job 999 not found"


def test_a_job_id_that_is_not_a_number_gets_422(client: httpx.Client) -> None:
    response = client.get("/jobs/abc")
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"].startswith("job_id: ")


def test_list_is_newest_first_with_filter_and_pages(client: httpx.Client) -> None:
    ids = [submit(client, name=f"job{i}")["id"] for i in range(5)]
    client.post(f"/jobs/{ids[1]}/cancel").raise_for_status()

    listing = client.get("/jobs").json()
    assert [j["id"] for j in listing["data"]] == ids[::-1]
    assert listing["count"] == 5

    page = client.get("/jobs", params={"limit": 2, "offset": 1}).json()
    assert [j["id"] for j in page["data"]] == ids[::-1][1:3]
    assert page["count"] == 5

    cancelled = client.get("/jobs", params={"status": "cancelled"}).json()
    assert [j["id"] for j in cancelled["data"]] == [ids[1]] and cancelled["count"] == 1


@pytest.mark.parametrize(
    "params,field",
    [({"status": "sleeping"}, "status"), ({"limit": 0}, "limit"), ({"offset": -1}, "offset")],
)
def test_bad_list_parameters_get_422(
    client: httpx.Client, params: dict[str, Any], field: str
) -> None:
    response = client.get("/jobs", params=params)
    assert response.status_code == 422
    assert response.json()["detail"][0]["msg"].startswith(f"{field}: ")


def test_cancelling_a_queued_job_ends_it_and_twice_is_a_conflict(client: httpx.Client) -> None:
    job = submit(client)
    cancelled = client.post(f"/jobs/{job['id']}/cancel").json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["timing"]["finished_at"] is not None
    again = client.post(f"/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert again.json()["detail"] == f"job {job['id']} is already cancelled"


def test_health(client: httpx.Client) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_bad_json_and_a_missing_content_type_say_what_to_send(client: httpx.Client) -> None:
    broken = client.post(
        "/jobs", content=b'{"epochs": }', headers={"content-type": "application/json"}
    )
    assert broken.status_code == 422
    assert broken.json()["detail"][0]["msg"].startswith("body: not valid JSON at character 12")
    untyped = client.post("/jobs", content=b'{"epochs": 2}', headers={"content-type": ""})
    assert untyped.status_code == 422
    assert "content-type: application/json" in untyped.json()["detail"][0]["msg"]


def test_a_model_that_is_not_there_says_why(client: httpx.Client) -> None:
    job = submit(client)
    missing = client.get(f"/jobs/{job['id']}/model")
    assert missing.status_code == 404 and "no checkpoint yet" in missing.json()["detail"]
    client.post(f"/jobs/{job['id']}/cancel").raise_for_status()
    ended = client.get(f"/jobs/{job['id']}/model").json()["detail"]
    assert (
        ended
        == f"job {job['id']} has no checkpoint: it ended (cancelled) before its first epoch did"
    )


def test_head_answers_every_get_route_as_get_does_without_the_body(
    client: httpx.Client,
) -> None:
    job = submit(client)
    for path in ("/healthz", "/jobs", f"/jobs/{job['id']}", "/jobs/999", "/nodes", "/ui/jobs/1"):
        got, head = client.get(path), client.head(path)
        assert head.status_code == got.status_code, path
        assert head.content == b""
        assert head.headers["content-type"] == got.headers["content-type"]
    assert client.head(f"/jobs/{job['id']}/cancel").status_code == 405


def test_the_dashboards_files_come_with_headers_that_fence_the_page(
    client: httpx.Client,
) -> None:
    for path in ("/ui/jobs", "/ui/jobs/1", "/ui/static/app.js", "/ui/static/plotly.min.js"):
        headers = client.get(path).headers
        policy = headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
        assert "script-src 'self' 'unsafe-eval';" in policy  # no inline or foreign scripts
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["x-frame-options"] == "DENY"
        assert headers["referrer-policy"] == "no-referrer"


def test_the_dashboard_asked_for_as_localhost_moves_to_the_address_ddpo_dashboard_prints(
    server: Any,
) -> None:
    """One origin, so the token the browser keeps for it is found again."""
    port = server.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=f"http://localhost:{port}", timeout=10) as by_name:
        for path in ("/", "/ui", "/ui/jobs/3?x=1"):
            moved = by_name.get(path)
            assert moved.status_code == 307, (path, moved.status_code)
            assert moved.headers["location"] == f"http://127.0.0.1:{port}{path}", path
        assert by_name.get("/healthz").status_code == 200  # the API answers under any name
    with httpx.Client(base_url=server.url, timeout=10) as by_address:
        assert by_address.get("/ui/jobs").status_code == 200


def test_the_openapi_document_says_which_routes_need_a_bearer_token(
    client: httpx.Client,
) -> None:
    document = client.get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    paths = document["paths"]
    assert paths["/jobs"]["post"]["security"] == [{"bearer": []}]
    assert paths["/jobs"]["post"]["description"].endswith("Roles: admin, user.")
    assert paths["/nodes/{node_id}/revoke"]["post"]["description"].endswith("Roles: admin.")
    assert "security" not in paths["/healthz"]["get"]


def test_the_api_reference_loads_only_files_this_server_serves(client: httpx.Client) -> None:
    for reference in ("/docs", "/redoc"):
        page = client.get(reference)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert sources and all(s.startswith("/") for s in sources), sources  # no CDN
        assert "/openapi.json" in page.text
        for source in sources:
            served = client.get(source)
            assert served.status_code == 200 and len(served.content) > 100, source
    assert client.get("/docs/static/../settings.py").status_code == 404
