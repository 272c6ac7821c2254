"""The KServe and Ray Serve doors' manifests (deploy/kserve/inferenceservice-oip.yaml, deploy/kserve/rayservice.yaml),
checked without a cluster: their pod specs against the Kubernetes API's own OpenAPI schemas (``kubernetes-validate``,
strict), the RayService's Serve config against Ray Serve's own schema (``ServeDeploySchema``) and its application
builder run on a real archive, the commands against the door's own command line, and the ports wired through the
auth proxy consistently."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.doors_support import EXTRAS
from tests.serving_support import REPO_ROOT, tiny_archives
from tests.test_deploy import KSERVE_COMPONENT_FIELDS

KSERVE = REPO_ROOT / "deploy" / "kserve"
INFERENCE_SERVICE = KSERVE / "inferenceservice-oip.yaml"
RAY_SERVICE = KSERVE / "rayservice.yaml"


def _document(path: Path) -> dict[str, Any]:
    documents = [document for document in yaml.safe_load_all(path.read_text()) if document]
    assert len(documents) == 1
    return dict(documents[0])


def _validate_pod(spec: dict[str, Any], name: str) -> None:
    import kubernetes_validate

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    try:
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as error:
        pytest.fail(f"{name}: {error.message} at {list(error.path)}")


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {item["name"]: item["value"] for item in container.get("env", [])}


def _check_proxy_in_front(proxy: dict[str, Any], door: dict[str, Any]) -> None:
    """The auth proxy forwards, without a token, to the ports the door listens on, and the door is on loopback."""
    command = proxy["command"]
    assert command[:3] == ["python", "-m", "deploy.auth_proxy"] and "--no-upstream-key" in command
    env = _env(door)
    assert env["INFERENCE_ADDRESS"] == "127.0.0.1"
    assert command[command.index("--upstream-rest-port") + 1] == env["INFERENCE_PORT"]
    assert command[command.index("--upstream-grpc-port") + 1] == env["GRPC_INFERENCE_PORT"]
    options = subprocess.run([sys.executable, "-m", "deploy.auth_proxy", "--help"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=60, check=True).stdout  # fmt: skip
    assert all(word in options for word in command if word.startswith("--")), "options the proxy does not have"


def _door_arguments(container: dict[str, Any]) -> Any:
    from doors.launch import build_parser

    command = container["command"]
    assert command[:3] == ["python", "-m", "doors"]
    return build_parser().parse_args(command[3:])


def _secure(containers: list[dict[str, Any]]) -> None:
    for container in containers:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]


def test_inference_service_runs_the_kserve_door() -> None:
    document = _document(INFERENCE_SERVICE)
    assert document["kind"] == "InferenceService" and document["apiVersion"] == "serving.kserve.io/v1beta1"
    predictor = document["spec"]["predictor"]
    spec = {key: value for key, value in predictor.items() if key not in KSERVE_COMPONENT_FIELDS}
    _validate_pod(spec, "explain-oip predictor")
    proxy, door = predictor["containers"]
    _check_proxy_in_front(proxy, door)
    arguments = _door_arguments(door)
    assert arguments.command == "serve" and arguments.server == "kserve"
    assert "runtime" not in predictor and "model" not in predictor, "a custom container: no TorchServe runtime"
    assert document["metadata"]["annotations"]["prometheus.io/port"] == _env(door)["EXPORTER_PORT"]
    _secure(predictor["containers"])


@EXTRAS
def test_ray_service_serve_config_and_pods(tmp_path: Path) -> None:
    from ray.serve.schema import ServeDeploySchema

    document = _document(RAY_SERVICE)
    assert document["kind"] == "RayService" and document["apiVersion"] == "ray.io/v1"
    spec = document["spec"]
    config = yaml.safe_load(spec["serveConfigV2"])
    ServeDeploySchema.model_validate(config)  # Ray Serve's own schema of a deploy config
    assert config["proxy_location"] == "Disabled", "clients come in through the KServe door"
    cluster = spec["rayClusterConfig"]
    import ray

    assert cluster["rayVersion"] == ray.__version__
    head = cluster["headGroupSpec"]["template"]["spec"]
    _validate_pod(head, "ray head")
    containers = {container["name"]: container for container in head["containers"]}
    _check_proxy_in_front(containers["auth-proxy"], containers["door"])
    arguments = _door_arguments(containers["door"])
    assert arguments.server == "ray" and arguments.attach and arguments.ray_address == "auto"
    _secure(head["containers"])
    workers = cluster["workerGroupSpecs"]
    for group in workers:
        _validate_pod(group["template"]["spec"], f"ray worker group {group['groupName']}")
        _secure(group["template"]["spec"]["containers"])
    worker_cpus = sum(int(group["rayStartParams"]["num-cpus"]) * group["replicas"] for group in workers)
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0", "replicas run on the worker pods"
    from doors.kserve.ray_deployment import build_app

    archive = tiny_archives()["sentiment"]
    for application in config["applications"]:
        module, name = application["import_path"].split(":")
        assert (module, name) == ("doors.kserve.ray_deployment", "build_app")
        args = dict(application["args"])
        assert args["archive"].startswith("/srv/explain/model_store/build/"), "the image's model store"
        app = build_app({**args, "archive": str(archive)})  # the builder on a real archive
        deployment = app._bound_deployment
        replicas = deployment.num_replicas
        assert replicas == int(args["replicas"])
        assert replicas * deployment.ray_actor_options["num_cpus"] <= worker_cpus, "the replicas fit the workers"
