"""What nodes offer (trainers with parameter schemas, scripts with content
hashes), GET /trainers, and jobs checked against it at submit and placed
only where they can run."""

from __future__ import annotations

from typing import Any

import httpx

from tests.api.conftest import ProtocolNode
from worker.mnist import TRAINER as MNIST

SHA_A, SHA_B = "a" * 64, "b" * 64

# A trainer's schema as pydantic writes it (what a worker reports).
LM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "context": {"type": "integer", "minimum": 1, "maximum": 64},
        "dropout": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
        "tokenizer": {"type": "string"},
    },
    "required": ["tokenizer"],
}


def lm_offer(version: str = "1", schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "lm", "version": version, "params_schema": schema or LM_SCHEMA}


def messages(response: httpx.Response) -> list[str]:
    assert response.status_code == 422, response.text
    return [item["msg"] for item in response.json()["detail"]]


def test_get_trainers_lists_each_version_its_schema_and_the_nodes_that_offer_it(
    client: httpx.Client,
) -> None:
    mnist = MNIST.offer("mnist").model_dump(mode="json")
    ProtocolNode(
        client, "a", trainers=[mnist, lm_offer()], scripts=[{"path": "t.py", "sha256": SHA_A}]
    )
    ProtocolNode(client, "b", trainers=[mnist, lm_offer("2", {"type": "object"})])
    ProtocolNode(client, "c", trainers=["mnist"], scripts=[{"path": "t.py", "sha256": SHA_A}])

    listed = client.get("/trainers").raise_for_status().json()

    by_version = {(t["name"], t["version"]): t for t in listed["trainers"]}
    assert by_version[("lm", "1")]["params_schema"] == LM_SCHEMA
    assert by_version[("lm", "1")]["nodes"] == ["a"]
    assert by_version[("lm", "2")]["nodes"] == ["b"]
    assert by_version[("mnist", MNIST.version)]["nodes"] == ["a", "b"]
    assert by_version[("mnist", MNIST.version)]["params_schema"]["additionalProperties"] is False
    # A node that only named the trainer declared no parameters.
    assert by_version[("mnist", "0")] == {
        "name": "mnist",
        "version": "0",
        "params_schema": None,
        "nodes": ["c"],
    }
    assert listed["scripts"] == [{"path": "t.py", "sha256": SHA_A, "nodes": ["a", "c"]}]


def test_a_parameter_the_trainers_schema_refuses_is_a_422_naming_it(client: httpx.Client) -> None:
    ProtocolNode(client, "a", trainers=[lm_offer()])

    too_small = client.post(
        "/jobs", json={"trainer": "lm", "params": {"tokenizer": "c", "context": 0}}
    )
    assert messages(too_small) == ["params.context: 0 is less than the minimum of 1"]
    wrong_type = client.post("/jobs", json={"trainer": "lm", "params": {"tokenizer": 3}})
    assert messages(wrong_type) == ["params.tokenizer: 3 is not of type 'string'"]
    unknown = client.post("/jobs", json={"trainer": "lm", "params": {"tokenizer": "c", "ctx": 8}})
    assert messages(unknown) == ["params.ctx: not a parameter of this trainer"]
    missing = client.post("/jobs", json={"trainer": "lm", "params": {}})
    assert messages(missing) == ["params.tokenizer: required"]
    assert unknown.json()["detail"][0]["loc"] == ["body", "params", "ctx"]

    good = client.post("/jobs", json={"trainer": "lm", "params": {"tokenizer": "c", "context": 8}})
    assert good.status_code == 201, good.text
    assert good.json()["spec"]["params"] == {"tokenizer": "c", "context": 8}
    # Nothing refused was stored.
    assert client.get("/jobs").json()["count"] == 1


def test_the_built_in_trainer_refuses_parameters_it_does_not_have(client: httpx.Client) -> None:
    ProtocolNode(client, "a", trainers=[MNIST.offer("mnist").model_dump(mode="json")])
    refused = client.post("/jobs", json={"params": {"hidden": 64}})
    assert messages(refused) == ["params.hidden: not a parameter of this trainer"]
    assert client.post("/jobs", json={}).status_code == 201


def test_params_must_suit_every_live_version_unless_the_job_names_one(
    client: httpx.Client,
) -> None:
    strict = {**LM_SCHEMA, "required": []}
    relaxed = {"type": "object", "properties": {"context": {"type": "integer"}}}
    ProtocolNode(client, "old", trainers=[lm_offer("1", strict)])
    new = ProtocolNode(client, "new", trainers=[lm_offer("2", relaxed)])
    # Version 2 takes a context of 500; version 1 does not, and says so.
    assert messages(client.post("/jobs", json={"trainer": "lm", "params": {"context": 500}})) == [
        "params.context: 500 is greater than the maximum of 64 (version '1' on old)"
    ]
    # Naming version 2: checked against it alone, and placed only where it is.
    pinned = client.post(
        "/jobs", json={"trainer": "lm", "trainer_version": "2", "params": {"context": 500}}
    )
    assert pinned.status_code == 201, pinned.text
    (start,) = new.poll()["start"]
    assert start["job_id"] == pinned.json()["id"]
    # Valid for both: taken without a version.
    assert client.post("/jobs", json={"trainer": "lm", "params": {"context": 8}}).status_code == 201


def test_a_node_cannot_loosen_what_the_other_nodes_check(client: httpx.Client) -> None:
    """A node offering a permissive "version 0" of a trainer (sorted first,
    or with no schema at all) does not let through params the real
    version's nodes refuse."""
    ProtocolNode(client, "honest", trainers=[MNIST.offer("mnist").model_dump(mode="json")])
    ProtocolNode(client, "loose", trainers=[{"name": "mnist", "version": "0"}])
    ProtocolNode(
        client, "looser", trainers=[{"name": "mnist", "version": "00", "params_schema": {}}]
    )
    refused = client.post("/jobs", json={"params": {"hidden": 64}})
    assert messages(refused) == [
        f"params.hidden: not a parameter of this trainer (version '{MNIST.version}' on honest)"
    ]
    assert client.get("/jobs").json()["count"] == 0
    # Pinned to the permissive version, the job runs only on the node offering it.
    pinned = client.post("/jobs", json={"trainer_version": "0", "params": {"hidden": 64}})
    assert pinned.status_code == 201, pinned.text
    assert client.get(f"/jobs/{pinned.json()['id']}").json()["status"] == "running"
    (part,) = [n for n in client.get("/nodes").json()["data"] if n["parts"]]
    assert part["name"] == "loose"


def test_a_trainer_no_live_node_has_waits_queued_with_a_reason_naming_it(
    client: httpx.Client,
) -> None:
    ProtocolNode(client, "a", trainers=["mnist"])
    job = client.post("/jobs", json={"trainer": "transformer", "params": {"layers": 2}})
    assert job.status_code == 201, job.text
    queued = client.get(f"/jobs/{job.json()['id']}").json()
    assert queued["status"] == "queued"
    assert "trainer 'transformer'" in queued["pending_reason"]
    assert "0 of 1 live node(s) qualify" in queued["pending_reason"]

    # A node that has it arrives: the job is placed there.
    late = ProtocolNode(client, "b", trainers=["transformer"])
    (start,) = late.poll()["start"]
    assert start["job_id"] == job.json()["id"]
    assert start["spec"]["params"] == {"layers": 2}


def test_a_script_path_that_leaves_the_directory_is_a_422(client: httpx.Client) -> None:
    for path in ("../train.py", "/etc/passwd.py", "a/../../b.py", "a\\b.py", "train.sh", ".x.py"):
        refused = client.post("/jobs", json={"script": {"path": path}})
        (message,) = messages(refused)
        assert message.startswith("script.path: "), message


def test_a_script_job_names_no_trainer_and_takes_no_params(client: httpx.Client) -> None:
    both = client.post("/jobs", json={"script": {"path": "t.py"}, "trainer": "mnist"})
    assert messages(both)[0].startswith("script: ")
    with_params = client.post("/jobs", json={"script": {"path": "t.py"}, "params": {"a": 1}})
    assert messages(with_params)[0].startswith("params: ")


def test_a_script_is_pinned_to_the_content_the_live_nodes_have(client: httpx.Client) -> None:
    a = ProtocolNode(client, "a", scripts=[{"path": "nlp/lm.py", "sha256": SHA_A}])
    job = client.post("/jobs", json={"script": {"path": "nlp/lm.py", "args": ["--epochs", "2"]}})
    assert job.status_code == 201, job.text
    assert job.json()["spec"]["script"] == {
        "path": "nlp/lm.py",
        "args": ["--epochs", "2"],
        "sha256": SHA_A,
    }
    assert job.json()["spec"]["trainer"] == "script"
    (start,) = a.poll()["start"]
    assert start["spec"]["script"]["sha256"] == SHA_A


def test_a_script_that_differs_between_live_nodes_is_refused(client: httpx.Client) -> None:
    ProtocolNode(client, "a", scripts=[{"path": "t.py", "sha256": SHA_A}])
    ProtocolNode(client, "b", scripts=[{"path": "t.py", "sha256": SHA_B}])
    (message,) = messages(client.post("/jobs", json={"script": {"path": "t.py"}}))
    assert message.startswith("script.path: 't.py' differs between the live nodes")
    assert f"{SHA_A[:12]} on a" in message and f"{SHA_B[:12]} on b" in message
    # Naming the content to run is the way out.
    chosen = client.post("/jobs", json={"script": {"path": "t.py", "sha256": SHA_B}})
    assert chosen.status_code == 201, chosen.text


def test_a_two_machine_script_job_runs_only_on_nodes_with_the_same_content(
    client: httpx.Client,
) -> None:
    a = ProtocolNode(client, "a", scripts=[{"path": "t.py", "sha256": SHA_A}])
    b = ProtocolNode(client, "b", scripts=[{"path": "t.py", "sha256": SHA_B}])
    job = client.post(
        "/jobs",
        json={"script": {"path": "t.py", "sha256": SHA_A}, "topology": {"num_machines": 2}},
    ).json()
    queued = client.get(f"/jobs/{job['id']}").json()
    assert queued["status"] == "queued"
    assert "2 live node(s) with script 't.py'" in queued["pending_reason"]
    assert "1 of 2 live node(s) qualify" in queued["pending_reason"]
    assert a.poll()["start"] == [] and b.poll()["start"] == []

    c = ProtocolNode(client, "c", scripts=[{"path": "t.py", "sha256": SHA_A}])
    placed = {n.name: n.poll()["start"] for n in (a, b, c)}
    assert [len(placed[n]) for n in ("a", "b", "c")] == [1, 0, 1]


def test_a_script_no_live_node_has_waits_queued_with_a_reason_naming_it(
    client: httpx.Client,
) -> None:
    ProtocolNode(client, "a", scripts=[{"path": "t.py", "sha256": SHA_A}])
    job = client.post("/jobs", json={"script": {"path": "other.py"}}).json()
    assert job["spec"]["script"]["sha256"] is None  # nothing to pin it to yet
    queued = client.get(f"/jobs/{job['id']}").json()
    assert queued["status"] == "queued"
    assert "script 'other.py'" in queued["pending_reason"]
