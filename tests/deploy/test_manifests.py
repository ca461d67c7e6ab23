"""deploy/k8s/ against the Kubernetes schemas (kubernetes-validate, offline, strict), KubeRay's RayService through
its parts that have schemas here (pod templates as core PodTemplates, serveConfigV2 through Ray Serve's own config
schema), and deploy/ray/ configs through Ray Serve's schema and the application's own argument check."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT

K8S = REPO_ROOT / "deploy" / "k8s"
RAY_CONFIGS = sorted((REPO_ROOT / "deploy" / "ray").glob("*.yaml"))
KUBERNETES_VERSION = "1.37.0"


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def core_documents() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        found += [(f"{path.name}:{doc['kind']}", doc) for doc in documents(path) if doc["kind"] != "RayService"]
    return found


def validate(resource: dict) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("name, resource", core_documents(), ids=[name for name, _ in core_documents()])
def test_each_manifest_passes_the_kubernetes_schema(name, resource):
    validate(resource)


def test_a_schema_error_is_caught():
    import kubernetes_validate

    broken = documents(K8S / "deployment.yaml")[0]
    broken["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["httpGet"]["pathh"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


def test_the_deployment_probes_the_servers_endpoints_and_asks_for_a_gpu():
    deployment = documents(K8S / "deployment.yaml")[0]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["PORT"] == str(container["ports"][0]["containerPort"])
    assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/models", env["LOG_DIR"], "/tmp"}
    assert env["MODEL_PATH"].startswith("/models/")
    pdb = documents(K8S / "pdb.yaml")[0]
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"], "a drain must be able to move a pod"


def rayservice() -> dict:
    return documents(K8S / "rayservice.yaml")[0]


def test_the_rayservice_pod_templates_pass_the_kubernetes_schema():
    spec = rayservice()["spec"]["rayClusterConfig"]
    templates = [spec["headGroupSpec"]["template"]] + [group["template"] for group in spec["workerGroupSpecs"]]
    for template in templates:
        validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template})
    workers = spec["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert workers["resources"]["limits"]["nvidia.com/gpu"] == "1"


@pytest.mark.parametrize("path", RAY_CONFIGS, ids=[p.name for p in RAY_CONFIGS])
def test_the_serve_configs_pass_ray_serves_schema_and_the_apps_argument_check(path):
    from ray.serve.schema import ServeDeploySchema

    from medgemma_xray.scaleout.serve_app import split_args

    config = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text()))
    for application in config.applications:
        assert application.import_path == "medgemma_xray.scaleout.serve_app:build_app"
        split_args(application.args)  # refuses an unknown argument, naming the valid ones


def test_the_rayservice_runs_the_same_application_as_the_gpu_config():
    from ray.serve.schema import ServeDeploySchema

    embedded = yaml.safe_load(rayservice()["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(embedded)
    gpu = yaml.safe_load((REPO_ROOT / "deploy" / "ray" / "medgemma-gpu.yaml").read_text())
    assert embedded["applications"] == gpu["applications"]


def test_an_unknown_application_argument_is_refused_by_name():
    from medgemma_xray.scaleout.serve_app import split_args

    with pytest.raises(ValueError, match="unknown application argument 'replica'.*replicas"):
        split_args({"replica": 2})


def test_the_rayservice_runs_with_ray_token_auth_and_opens_only_the_guarded_ingress():
    spec = rayservice()["spec"]["rayClusterConfig"]
    templates = [spec["headGroupSpec"]["template"]] + [group["template"] for group in spec["workerGroupSpecs"]]
    for template in templates:
        for container in template["spec"]["containers"]:
            env = {item["name"]: item for item in container["env"]}
            assert env["RAY_AUTH_MODE"]["value"] == "token", container["name"]
            assert "secretKeyRef" in env["RAY_AUTH_TOKEN"]["valueFrom"], "the token comes from a Secret"
            ports = {port["containerPort"] for port in container.get("ports", [])}
            assert not ports & {8265, 8000, 10001}, "no dashboard, Serve proxy or Ray client port is declared"
    head = spec["headGroupSpec"]
    assert head["rayStartParams"].get("dashboard-host", "127.0.0.1") != "0.0.0.0"
    access = documents(K8S / "rayservice-access.yaml")
    service = next(doc for doc in access if doc["kind"] == "Service")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert [port["targetPort"] for port in service["spec"]["ports"]] == [7860], "only the guarded ingress"
    policy = next(doc for doc in access if doc["kind"] == "NetworkPolicy")
    open_to_all = [rule for rule in policy["spec"]["ingress"] if "from" not in rule]
    assert [port["port"] for rule in open_to_all for port in rule["ports"]] == [7860]
