"""deploy/kubernetes/ against the Kubernetes API's schemas (offline, with
kubernetes-validate) and against our real entry points, as
tests/unit/test_compose.py holds docker-compose.yml: every command is a
console script this package installs whose flags parse, every environment
variable is one its settings read, the tokens come from a Secret, the
servers are probed on /healthz, and workers reach their peers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO
from tests.unit.test_compose import ENTRY_POINTS, environment_names

MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
# The oldest Kubernetes release still supported upstream when this was written.
KUBERNETES = "1.32"


def documents() -> list[dict[str, Any]]:
    return [d for path in MANIFESTS for d in yaml.safe_load_all(path.read_text()) if d]


def pod_templates() -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in documents():
        template = doc.get("spec", {}).get("template")
        if template is not None:
            yield doc["metadata"]["name"], template["spec"]


def ours() -> Iterator[tuple[str, dict[str, Any]]]:
    """Each container that runs a command of this package."""
    for name, pod in pod_templates():
        for container in pod["containers"]:
            if container.get("command", [""])[0] in ENTRY_POINTS:
                yield name, container


def by_name(name: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in documents()
        if d["metadata"]["name"] == name and "spec" in d and "template" in d["spec"]
    ]
    return found


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_each_object_is_valid_against_the_kubernetes_schemas(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_a_wrong_field_would_be_caught() -> None:
    worker = by_name("ddpo-worker")
    broken = yaml.safe_load(yaml.safe_dump(worker))
    broken["spec"]["template"]["spec"]["hostNetwrk"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_every_command_and_variable_is_one_the_entry_point_reads() -> None:
    found = list(ours())
    assert {c["command"][0] for _, c in found} == set(ENTRY_POINTS)
    for name, container in found:
        parser, settings = ENTRY_POINTS[container["command"][0]]
        parser().parse_args(container["command"][1:])
        unknown = {e["name"] for e in container.get("env", [])} - environment_names(settings)
        assert not unknown, f"{name} sets variables nothing reads: {sorted(unknown)}"


def test_tokens_and_the_database_come_from_the_secret() -> None:
    for name, container in ours():
        for env in container.get("env", []):
            if env["name"].endswith("_TOKEN") or env["name"] == "DATABASE_URL":
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                assert ref and ref["name"] == "ddpo-secrets", f"{name}: {env['name']} in the open"


def test_servers_are_probed_on_healthz_and_share_the_checkpoints() -> None:
    server = by_name("ddpo-server")
    pod = server["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    port = int(container["command"][container["command"].index("--port") + 1])
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": port}
    assert server["spec"]["replicas"] >= 2
    (claim,) = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]]
    (pvc,) = [d for d in documents() if d["kind"] == "PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == claim and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    env = {e["name"]: e for e in container["env"]}
    (mount,) = container["volumeMounts"]
    assert env["DDPO_ARTIFACTS_DIR"]["value"] == mount["mountPath"]


def test_workers_reach_the_server_and_their_peers_and_leave_cleanly() -> None:
    worker = by_name("ddpo-worker")
    pod = worker["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    # The server's Service, by its cluster DNS name, on its port.
    (service,) = [
        d for d in documents() if d["kind"] == "Service" and d["metadata"]["name"] == "ddpo-server"
    ]
    url = f"http://ddpo-server.{service['metadata']['namespace']}.svc.cluster.local:8000"
    assert env["DDPO_SERVER_URL"]["value"] == url
    assert service["spec"]["ports"][0]["port"] == 8000
    # Peers at the node's own address, on the host's network.
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert env["DDPO_WORKER_ADDRESS"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["DDPO_WORKER_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert pod["nodeSelector"] == {"ddpo.io/worker": "true"}
    # Leaving: the jobs get their grace and the worker its own before the kill.
    leave = float(env["DDPO_WORKER_LEAVE_GRACE_S"]["value"])
    stop = float(env["DDPO_WORKER_STOP_GRACE_S"]["value"])
    assert leave + stop < pod["terminationGracePeriodSeconds"]
    hook = container["lifecycle"]["preStop"]["exec"]["command"]
    assert "kill -TERM 1" in hook[-1]
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/dev/shm", "/var/lib/ddpo/runs"}
    assert env["DDPO_WORKER_WORK_DIR"]["value"] == "/var/lib/ddpo/runs"
