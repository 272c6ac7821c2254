"""The production stack's files, checked without a Docker engine: the compose file, the Dockerfile, the Prometheus
config and rules (``promtool``), the Grafana provisioning and dashboard, and the Kubernetes/KServe manifests parse,
reference files that exist, and use metric names the service really exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from doors.torchserve.config import Ports
from doors.torchserve.process import Server
from records.writer import RECORD_ERRORS
from serving_core import metrics
from tests.ops_support import ops_server, rest_call, worker_pids
from tests.serving_support import REPO_ROOT, owned_popen

DEPLOY = REPO_ROOT / "deploy"
COMPOSE = REPO_ROOT / "docker-compose.yml"
GPU_OVERRIDE = DEPLOY / "docker-compose.gpu.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "explanation-service.json"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
RULES = DEPLOY / "prometheus" / "alerts.yml"

#: Metrics that come from outside the service: the worker-memory exporter (compose) and the kubelet (Kubernetes).
EXTERNAL_METRICS = {"namedprocess_namegroup_memory_bytes", "container_memory_working_set_bytes", "up"}
_PROMQL_WORDS = {
    "sum", "by", "rate", "histogram_quantile", "le", "without", "avg", "max", "min", "delta", "irate", "increase",
    "on", "ignoring", "group_left", "group_right", "count", "and", "or", "unless", "bool", "offset",
}  # fmt: skip


def service_metric_names() -> set[str]:
    """Every series name the service exports: the explanation metrics (handlers/metrics.py, with the suffixes
    prometheus-client adds), the records writer's (records/writer.py) and TorchServe's
    (doors/torchserve/metrics.yaml)."""
    names: set[str] = set()
    for metric in (metrics.EXPLANATION_SECONDS, metrics.STAGE_SECONDS, metrics.EXPLANATIONS, metrics.ERRORS,
                   metrics.BATCH_SIZE, metrics.UNSURE_ROWS, RECORD_ERRORS):  # fmt: skip
        for family in metric.collect():
            names.update(sample.name for sample in family.samples)
            kind = family.type
            base = family.name
            if kind == "histogram":
                names.update({f"{base}_bucket", f"{base}_sum", f"{base}_count"})
            elif kind == "counter":
                names.add(f"{base}_total")
    document = yaml.safe_load((REPO_ROOT / "doors" / "torchserve" / "metrics.yaml").read_text())
    for section in ("ts_metrics", "model_metrics"):
        for entries in (document.get(section) or {}).values():
            names.update(entry["name"] for entry in entries)
    return names


def expression_metrics(expression: str) -> set[str]:
    """Metric names used in a PromQL expression (identifiers that are not functions, keywords or labels)."""
    without_strings = re.sub(r'"[^"]*"', '""', expression)
    without_labels = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_by = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", without_labels)
    without_ranges = re.sub(r"\[[^\]]*\]", "[]", without_by)
    identifiers = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", without_ranges))
    return {name for name in identifiers if name not in _PROMQL_WORDS and not name.startswith("$")}


def dashboard_expressions() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in document["panels"] for target in panel["targets"]]


def _compose_sources(document: dict[str, Any]) -> list[str]:
    sources = []
    for service in document["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                sources.append(source)
    return sources


def test_compose_file_is_complete_and_references_existing_files() -> None:
    document = yaml.safe_load(COMPOSE.read_text())
    services = document["services"]
    assert {"explain", "prometheus", "grafana", "process-exporter"} <= set(services)
    explain = services["explain"]
    assert (REPO_ROOT / explain["build"]["context"] / explain["build"]["dockerfile"]).is_file()
    # Only inference (and Prometheus, which lives in this namespace) are published, and on the host's loopback.
    published = {port.split(":")[-1]: port for port in explain["ports"]}
    assert set(published) == {"8080", "7070", "9090"}, published
    assert all(port.startswith("127.0.0.1:") for port in explain["ports"])
    assert explain["environment"]["METRICS_ADDRESS"] == "127.0.0.1"
    assert "DISABLE_TOKEN_AUTH" not in json.dumps(document).upper().replace("-", "_")
    # Prometheus and the process exporter scrape the service's loopback from inside its network namespace.
    assert services["prometheus"]["network_mode"] == services["process-exporter"]["network_mode"] == "service:explain"
    assert services["grafana"]["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    for source in _compose_sources(document):
        assert (REPO_ROOT / source).exists(), f"compose mounts {source}, which does not exist"
    override = yaml.safe_load(GPU_OVERRIDE.read_text())
    gpu = override["services"]["explain"]
    assert gpu["environment"]["PROFILE"] == "gpu" and "cu" in gpu["build"]["args"]["TORCH_INDEX_URL"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    profiles = yaml.safe_load((REPO_ROOT / "doors" / "torchserve" / "profiles.yaml").read_text())
    assert {explain["environment"]["PROFILE"], gpu["environment"]["PROFILE"]} <= set(profiles)


def test_dockerfile_copies_existing_paths_and_runs_hardened() -> None:
    text = (REPO_ROOT / "Dockerfile").read_text()
    for source in re.findall(r"^COPY\s+(?!--)(\S+)", text, flags=re.MULTILINE):
        assert (REPO_ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
    assert re.search(r"^USER\s+explain\b", text, flags=re.MULTILINE), "the service must not run as root"
    assert "torch==${TORCH_VERSION}" in text and "ARG TORCH_VERSION=2.13.0" in text
    assert "disable-token-auth" not in text and "METRICS_ADDRESS=127.0.0.1" in text
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert {"run", ".venv", ".git"} <= set(ignored), "tokens (run/) and the virtualenv must not enter the image"


def test_dashboard_covers_the_issue_and_uses_exported_metric_names() -> None:
    document = json.loads(DASHBOARD.read_text())
    titles = " | ".join(panel["title"].lower() for panel in document["panels"])
    for topic in ("p50 / p95 / p99", "explanations per second", "errors by code", "batch size", "queue time",
                  "memory"):  # fmt: skip
        assert topic in titles, f"no panel about {topic}: {titles}"
    known = service_metric_names() | EXTERNAL_METRICS
    used: set[str] = set()
    for expression in dashboard_expressions():
        used |= expression_metrics(expression)
    assert used, "no metric found in the dashboard"
    assert used <= known, f"the dashboard uses unknown metrics {sorted(used - known)}"
    assert {"explain_seconds_bucket", "explain_errors_total", "explain_batch_size_bucket"} <= used
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    assert all(panel["datasource"]["uid"] == uid for panel in document["panels"])
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/dashboards.yml").read_text())
    compose = yaml.safe_load(COMPOSE.read_text())
    mounts = dict(volume.rsplit(":", 2)[:2] for volume in compose["services"]["grafana"]["volumes"] if ":" in volume)
    assert mounts["./deploy/grafana/dashboards"] == provider["providers"][0]["options"]["path"]


def test_alert_rules_use_exported_metric_names() -> None:
    document = yaml.safe_load(RULES.read_text())
    known = service_metric_names() | EXTERNAL_METRICS
    for rule in document["groups"][0]["rules"]:
        assert expression_metrics(rule["expr"]) <= known, rule


def test_expression_metrics_parser() -> None:
    names = expression_metrics(
        'histogram_quantile(0.95, sum by (le, method) (rate(explain_seconds_bucket{model=~"$model"}[5m]))) / up'
    )
    assert names == {"explain_seconds_bucket", "up"}


@pytest.mark.parametrize("path", [PROMETHEUS, RULES], ids=["config", "rules"])
def test_promtool_accepts_the_prometheus_files(path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: `make test` installs it (scripts/system_setup.py)")
    command = "config" if path == PROMETHEUS else "rules"
    result = subprocess.run([promtool, "check", command, str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _kubernetes_documents() -> list[dict[str, Any]]:
    documents = []
    # The TorchServe deployment's manifests; the KServe/Ray doors' ones are checked in tests/test_deploy_doors.py.
    for path in [*sorted((DEPLOY / "kubernetes").glob("*.yaml")), DEPLOY / "kserve" / "inferenceservice.yaml"]:
        documents += [document for document in yaml.safe_load_all(path.read_text()) if document]
    return documents


def test_kubernetes_manifests_are_consistent() -> None:
    documents = _kubernetes_documents()
    by_kind = {document["kind"]: document for document in documents}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "NetworkPolicy", "PodMonitor", "InferenceService"} <= (
        set(by_kind)
    )
    kustomization = by_kind.pop("Kustomization")
    for resource in kustomization["resources"]:
        assert (DEPLOY / "kubernetes" / resource).is_file()
    deployment = by_kind["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"] == labels == by_kind["Service"]["spec"]["selector"]
    assert by_kind["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"] == labels
    assert by_kind["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    containers = {item["name"]: item for item in deployment["spec"]["template"]["spec"]["containers"]}
    container, proxy = containers["explain"], containers["auth-proxy"]
    ports = {port["name"]: port["containerPort"] for item in containers.values() for port in item["ports"]}
    assert ports == {"http": 8080, "grpc": 7070, "ts-metrics": 8082, "metrics": 8083}, ports
    assert {port["name"] for port in proxy["ports"]} == {"http", "grpc"}, "clients must come in through the proxy"
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["INFERENCE_ADDRESS"] == "127.0.0.1" and env["METRICS_ADDRESS"] == "0.0.0.0"
    upstream = proxy["command"]
    assert upstream[:3] == ["python", "-m", "deploy.auth_proxy"]
    assert upstream[upstream.index("--upstream-rest-port") + 1] == env["INFERENCE_PORT"]
    assert upstream[upstream.index("--upstream-grpc-port") + 1] == env["GRPC_INFERENCE_PORT"]
    assert (REPO_ROOT / "deploy" / "auth_proxy.py").is_file()
    assert env["PROFILE"] in yaml.safe_load((REPO_ROOT / "doors/torchserve/profiles.yaml").read_text())
    for item in containers.values():
        assert item["securityContext"]["allowPrivilegeEscalation"] is False
        assert item["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    monitor_ports = {endpoint["port"] for endpoint in by_kind["PodMonitor"]["spec"]["podMetricsEndpoints"]}
    assert monitor_ports == {"metrics", "ts-metrics"}
    policy_ports = {port["port"] for rule in by_kind["NetworkPolicy"]["spec"]["ingress"] for port in rule["ports"]}
    assert policy_ports == {8080, 7070, 8082, 8083}
    predictor = by_kind["InferenceService"]["spec"]["predictor"]["containers"]
    assert predictor[0]["command"] == proxy["command"] and predictor[0]["ports"][0]["containerPort"] == 8080
    assert {item["image"] for item in predictor} == {container["image"]}


@pytest.fixture(scope="session")
def server(request: pytest.FixtureRequest) -> Server:
    return ops_server(request)


def _prometheus_query(port: int, expression: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    with urllib.request.urlopen(url, timeout=10) as response:
        return dict(json.loads(response.read()))


@pytest.mark.slow
def test_real_prometheus_loads_the_compose_config_and_answers_the_dashboard(server: Server, tmp_path: Path) -> None:
    """The real Prometheus runs deploy/prometheus/prometheus.yml (and its rules), with only the targets' ports
    rewritten to a live test server and a 1 s scrape interval; both service targets come up, the rules load, and
    every dashboard query is valid PromQL, with data for the explanation panels."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("the `prometheus` binary is missing: `make test` installs it (scripts/system_setup.py)")
    for method in ("none", "relevance", "rollout", "attention"):
        document: dict[str, Any] = {"text": "the crew were lovely"}
        if method != "none":
            document["explain"] = {"method": method}
        assert rest_call(server, "sentiment", json.dumps(document).encode())[0] == 200
    assert rest_call(server, "sentiment", b'{"text": "x", "explain": {"method": "lime"}}')[0] == 400
    exporter = shutil.which("prometheus-process-exporter") or shutil.which("process-exporter")
    if exporter is None:
        pytest.fail("process-exporter is missing: install it (`make test` does, through scripts/system_setup.py)")
    exporter_port = Ports.free().inference
    config = yaml.safe_load(PROMETHEUS.read_text())
    config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = "1s"
    rewrite = {
        "127.0.0.1:8083": server.ports.exporter,
        "127.0.0.1:8082": server.ports.metrics,
        "127.0.0.1:9256": exporter_port,
    }
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            static["targets"] = [
                f"127.0.0.1:{rewrite.get(target, Ports.free().inference)}" for target in static["targets"]
            ]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(RULES, tmp_path / RULES.name)
    port = Ports.free().inference
    log = (tmp_path / "prometheus.log").open("wb")
    memory = owned_popen(
        [exporter, f"-config.path={DEPLOY / 'process-exporter' / 'process-exporter.yml'}",
         f"-web.listen-address=127.0.0.1:{exporter_port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    process = owned_popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        up: dict[str, float] = {}
        data: dict[str, Any] = {}
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                answer = _prometheus_query(port, "up")
                up = {item["metric"]["job"]: float(item["value"][1]) for item in answer["data"]["result"]}
                data = _prometheus_query(port, "explain_explanations_total")
            except OSError:
                continue
            if (
                all(up.get(job) == 1 for job in ("explanations", "torchserve", "worker-processes"))
                and data["data"]["result"]
            ):
                break
        assert all(up.get(job) == 1 for job in ("explanations", "torchserve", "worker-processes")), (
            f"{up}; see {tmp_path / 'prometheus.log'}"
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10) as response:
            rules = json.loads(response.read())["data"]["groups"]
        assert sum(len(group["rules"]) for group in rules) == len(
            yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
        )
        time.sleep(3)  # a few scrapes, so that rate() over the window has two points
        empty = []
        for expression in dashboard_expressions():
            concrete = expression.replace("$__rate_interval", "1m").replace("$model", ".*")
            answer = _prometheus_query(port, concrete)
            assert answer["status"] == "success", (expression, answer)
            if ("explain_" in expression or "namedprocess" in expression) and not answer["data"]["result"]:
                empty.append(expression)
        assert not empty, f"dashboard queries with no data after traffic: {empty}"
        # The worker-memory panel has one series per worker of the server (grouped by worker socket number).
        groups = _prometheus_query(port, 'namedprocess_namegroup_memory_bytes{memtype="resident"}')["data"]["result"]
        names = {item["metric"]["groupname"] for item in groups}
        sockets = set()
        for model in server.models:
            for pid in worker_pids(server, model):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                sockets.add(re.search(r"\.ts\.sock\.(\d+)", command).group(1))  # type: ignore[union-attr]
        assert {f"torchserve-worker-{socket}" for socket in sockets} | {"torchserve-frontend"} <= names, names
    finally:
        for child in (process, memory):
            child.terminate()
            try:
                child.wait(timeout=20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _compose_binary() -> list[str] | None:
    """``docker compose`` (plugin or the v1 shim) or ``docker-compose``, whichever answers; None if neither."""
    for command in (["docker", "compose"], ["docker-compose"]):
        if shutil.which(command[0]) is None:
            continue
        if subprocess.run([*command, "version"], capture_output=True, timeout=60).returncode == 0:
            return command
    return None


def _compose_config(*files: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    compose = _compose_binary()
    if compose is None:
        pytest.skip(
            "no `docker compose` here: install Docker Compose (apt-get install -y docker-compose) to validate the "
            "compose files"
        )
    command = [*compose, "-p", "explain-config-check", *(item for path in files for item in ("-f", str(path)))]
    clean = {
        key: value for key, value in os.environ.items() if key not in {"GRAFANA_ADMIN_PASSWORD", "MODEL_STORE_DIR"}
    }
    return subprocess.run(
        [*command, "config"], cwd=REPO_ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60
    )


def test_docker_compose_config_accepts_the_gpu_and_models_overrides(tmp_path: Path) -> None:
    """``docker compose config`` (the real Compose) merges docker-compose.yml with each override: the GPU one keeps
    the base's hardening and adds the CUDA build, the GPU profile and one reserved GPU; the models one mounts a host
    folder read-only as the served model store. Without a Grafana password the file is refused."""
    password = {"GRAFANA_ADMIN_PASSWORD": "config-check"}
    result = _compose_config(COMPOSE, env=password)
    assert result.returncode == 0, result.stderr
    base = yaml.safe_load(result.stdout)["services"]["explain"]
    result = _compose_config(COMPOSE, GPU_OVERRIDE, env=password)
    assert result.returncode == 0, result.stderr
    gpu = yaml.safe_load(result.stdout)["services"]["explain"]
    assert gpu["image"] == "explain-service:gpu" and gpu["environment"]["PROFILE"] == "gpu"
    assert "/whl/cu" in gpu["build"]["args"]["TORCH_INDEX_URL"]
    assert gpu["deploy"]["resources"]["reservations"]["devices"] == [
        {"capabilities": ["gpu"], "count": 1, "driver": "nvidia"}
    ]
    for key in ("cap_drop", "security_opt", "ports", "volumes"):
        assert sorted(gpu[key]) == sorted(base[key]), key
    assert gpu["environment"]["METRICS_ADDRESS"] == base["environment"]["METRICS_ADDRESS"] == "127.0.0.1"
    models = DEPLOY / "docker-compose.models.yml"
    result = _compose_config(COMPOSE, models, env={**password, "MODEL_STORE_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    served = yaml.safe_load(result.stdout)["services"]["explain"]
    assert f"{tmp_path}:/srv/explain/models:ro" in served["volumes"]
    assert served["environment"]["MODEL_STORE"] == "/srv/explain/models"
    refused = _compose_config(COMPOSE, env={})
    assert refused.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in refused.stderr
    refused = _compose_config(COMPOSE, models, env=password)
    assert refused.returncode != 0 and "MODEL_STORE_DIR" in refused.stderr


#: Fields of a KServe predictor that are not PodSpec fields (KServe's ComponentExtensionSpec; the rest of the
#: predictor is a PodSpec, validated as one).
KSERVE_COMPONENT_FIELDS = {
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "containerConcurrency", "timeout",
    "canaryTrafficPercent", "logger", "batcher", "labels", "annotations", "deploymentStrategy",
}  # fmt: skip


def test_kubernetes_manifests_pass_the_kubernetes_schemas() -> None:
    """Every manifest against the Kubernetes API's own OpenAPI schemas (``kubernetes-validate``, strict: unknown
    fields are errors). The KServe InferenceService's predictor is validated as the PodSpec it extends; the
    PodMonitor (a prometheus-operator CRD) and the Kustomization have no schema there and are checked by
    test_kubernetes_manifests_are_consistent only."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    checked = []
    for document in _kubernetes_documents():
        kind = document["kind"]
        if kind in {"Kustomization", "PodMonitor"}:
            continue
        if kind == "InferenceService":
            predictor = document["spec"]["predictor"]
            spec = {key: value for key, value in predictor.items() if key not in KSERVE_COMPONENT_FIELDS}
            document = {"apiVersion": "v1", "kind": "Pod", "metadata": document["metadata"], "spec": spec}
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{kind} {document['metadata']['name']}: {error.message} at {list(error.path)}")
        checked.append(kind)
    assert sorted(checked) == sorted(
        ["Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy", "InferenceService"]
    ), checked
