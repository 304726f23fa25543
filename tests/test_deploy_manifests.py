"""deploy/kubernetes: every manifest is valid against the Kubernetes schemas (strict: no unknown
fields), offline through kubernetes-validate, and the pieces fit together: the worker command is a
valid `radixflow serve` command line, the router command a valid sglang-router one, and the
router's service discovery finds the worker pods on the port they serve."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate")

K8S_VERSION = "1.33"
MANIFESTS = sorted((Path(__file__).resolve().parents[1] / "deploy" / "kubernetes").glob("*.yaml"))


def documents() -> list[dict]:
    docs = [d for path in MANIFESTS for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs, "no manifests under deploy/kubernetes"
    return docs


def by_name(kind: str, name: str) -> dict:
    (doc,) = [d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def container(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_matches_the_kubernetes_schema(doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # raises ValidationError


def test_a_broken_manifest_is_caught():
    bad = by_name("Deployment", "radixflow-worker")
    bad = {**bad, "spec": {**bad["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_worker_command_is_a_radixflow_serve_command():
    from radixflow.runtime.server_args import ServerArgs

    cmd = container(by_name("Deployment", "radixflow-worker"))["command"]
    assert cmd[:2] == ["radixflow", "serve"]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli(parser.parse_args(cmd[2:]))
    assert args.host == "0.0.0.0" and args.dp_size == 1


def test_router_discovers_the_worker_pods():
    from sglang_router.launch_router import parse_router_args

    worker = by_name("Deployment", "radixflow-worker")
    router = container(by_name("Deployment", "radixflow-router"))
    assert router["command"][:3] == ["python", "-m", "sglang_router.launch_router"]
    rargs = parse_router_args(router["command"][3:])
    assert rargs.service_discovery and rargs.service_discovery_namespace == worker["metadata"]["namespace"]
    pod_labels = worker["spec"]["template"]["metadata"]["labels"]
    assert rargs.selector and all(pod_labels.get(k) == v for k, v in rargs.selector.items())
    assert rargs.service_discovery_port in [p["containerPort"] for p in container(worker)["ports"]]
    role = by_name("Role", "radixflow-router")
    assert {"list", "watch"} <= set(role["rules"][0]["verbs"]) and role["rules"][0]["resources"] == ["pods"]
    router_pod = by_name("Deployment", "radixflow-router")["spec"]["template"]
    assert router_pod["spec"]["serviceAccountName"] == "radixflow-router"
    service = by_name("Service", "radixflow")
    router_labels = router_pod["metadata"]["labels"]
    assert all(router_labels.get(k) == v for k, v in service["spec"]["selector"].items())
