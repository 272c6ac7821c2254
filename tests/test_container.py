"""The container stack for real: ``make container-up`` builds the image from the ``Dockerfile`` and starts
``explain``, ``prometheus`` and ``process-exporter`` from ``docker-compose.yml`` (Grafana has no image on these
machines); the tests talk to it only through the host's published ports and ``docker`` itself.

Models: the image is built with ``BUILD_MODELS=false`` and serves the tiny test archives, a host folder that the
container's user cannot write, mounted read-only by ``deploy/docker-compose.models.yml`` (the documented way to reuse
host-built models). Skipped with one line saying what to install where no engine (Docker, or Podman's Docker socket)
answers ``docker info``; where ``$ENGINE_SH`` names an engine script (``.ci/run`` sets it on the project's build
machines), ``make test`` starts the engine through it first. Bounded: each ``make`` call has its
own timeout, and the stack is torn down by its project name when the module ends, also after a failure.
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
import yaml
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from deploy.engine import docker_env
from doors.models import DEFAULT_MODELS
from explain_client import protos
from explainers import explain
from tests import container_support as support
from tests.container_support import Stack, connects, container_ip, prometheus_get, prometheus_query, wait_until
from tests.metric_names import may_be_empty_after_traffic, rule_name, rules
from tests.serving_support import REPO_ROOT, b64, http_post, png_bytes

logger = logging.getLogger(__name__)

TEXT = "the service was quick and the staff were lovely"
LABELS = ("negative", "neutral", "positive")
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "dashboards" / "explanation-service.json"
COMPOSE = REPO_ROOT / "docker-compose.yml"
#: Ports that must stay on the container's loopback: management REST/gRPC, TorchServe and explanation metrics, the
#: process exporter.
PRIVATE_PORTS = (8081, 7071, 8082, 8083, 9256)
#: The stack's scrape interval is 15 s (deploy/prometheus/prometheus.yml): two scrapes after the traffic, with room.
SCRAPE_WAIT = 90
#: Grafana's $__rate_interval for a 15 s scrape interval (four intervals).
RATE_INTERVAL = "1m"
#: The first test also brings the stack up (a cold image build included): pytest-timeout's bound covers that.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(support.COLD_UP_TIMEOUT + support.HEALTH_TIMEOUT)]
#: Checked once, at collection: with no engine the whole module is one skip, one line saying what to install.
ENGINE_PROBLEM = support.engine_problem()
if ENGINE_PROBLEM is not None:
    pytest.skip(support.skip_line(ENGINE_PROBLEM), allow_module_level=True)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with pytest.MonkeyPatch.context() as patch:  # every `docker` call of the module reaches the same engine
        host = docker_env().get("DOCKER_HOST")
        if host:
            patch.setenv("DOCKER_HOST", host)
        with support.running_stack() as running:
            yield running


@pytest.fixture(scope="module")
def token(stack: Stack) -> str:
    return stack.token()


def _rest(stack: Stack, model: str, document: Any, token: str | None) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{stack.ports['rest']}/predictions/{model}"
    return http_post(url, json.dumps(document).encode(), token)


def _grpc(stack: Stack, model: str, document: Any, token: str | None) -> bytes:
    inference_pb2, inference_grpc = protos.inference_stubs()
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(f"127.0.0.1:{stack.ports['grpc']}") as channel:
        stub = inference_grpc.InferenceAPIsServiceStub(channel)
        request = inference_pb2.PredictionsRequest(model_name=model, input={"body": json.dumps(document).encode()})
        reply = stub.Predictions(request, metadata=metadata, timeout=60)
    return bytes(reply.prediction)


def _png_b64() -> str:
    return b64(png_bytes())


def _reference_relevance(target: int) -> Any:
    """The mounted tiny sentiment model's relevance of TEXT, computed in this process."""
    model_dir = support.ARCHIVE_CACHE / "sentiment" / "archive" / "model"
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    inputs = tokenizer([TEXT], return_tensors="pt", truncation=True, max_length=128)
    return explain(model, dict(inputs), method="relevance", target=target)


def _check_models_in_image(stack: Stack, store: Path) -> subprocess.CompletedProcess[str]:
    """The launcher's start-up model check, run in the stack's image as its user, with ``store`` (a host folder)
    mounted read-write where the image's default model store is, as the issue's user did."""
    script = (
        "import logging; from doors import models; logging.basicConfig(level=logging.INFO);"
        "models.ensure_models(models.default_model_store(), models.DEFAULT_MODELS)"
    )
    command = ["docker", "run", "--rm", "--network", "none", "-v", f"{store}:/srv/explain/model_store/build"]
    command += [stack.image, "python", "-c", script]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_a_host_model_folder_the_user_cannot_write_is_served_as_it_is(stack: Stack, tmp_path: Path) -> None:
    """The issue's failure: `model_store/build` of the host mounted into the container made the start fail on the
    build's lock file (PermissionError, the folder belongs to the host's user). It is now served as it is: no build,
    nothing written."""
    store = _host_store(tmp_path, tuple(DEFAULT_MODELS))
    before = sorted(path.relative_to(store) for path in store.rglob("*"))
    result = _check_models_in_image(stack, store)
    assert result.returncode == 0, result.stderr
    assert "is not writable by uid 10001: serving its archives as they are" in result.stderr, result.stderr
    assert sorted(path.relative_to(store) for path in store.rglob("*")) == before, "the check wrote into the store"


def test_a_host_model_folder_without_an_archive_fails_clearly(stack: Stack, tmp_path: Path) -> None:
    result = _check_models_in_image(stack, _host_store(tmp_path, ("sentiment",)))
    assert result.returncode != 0
    missing = sorted(set(DEFAULT_MODELS) - {"sentiment"})
    assert "FileNotFoundError" in result.stderr and str(missing) in result.stderr, result.stderr
    assert "cannot write" in result.stderr and "PermissionError" not in result.stderr, result.stderr


def _host_store(tmp_path: Path, names: tuple[str, ...]) -> Path:
    """A host folder with copies of the tiny archives of ``names`` (no lock files), owned by the test's user and
    readable (not writable) by others, like a host's ``model_store/build``."""
    store = tmp_path / "store"
    for name in names:
        shutil.copytree(support.ARCHIVE_CACHE / name, store / name)
    for path in (tmp_path, store):
        path.chmod(0o755)
    return store


def test_container_up_prints_the_addresses_and_how_to_read_the_token(stack: Stack) -> None:
    output = stack.outputs[0]
    figures = re.search(r"image built in [\d.]+ s; up to healthy in [\d.]+ s.*", output)
    assert figures, output
    logger.warning("first make container-up: %s", figures.group(0))
    assert f"http://127.0.0.1:{stack.ports['rest']}" in output and f"127.0.0.1:{stack.ports['grpc']}" in output
    assert f"http://127.0.0.1:{stack.ports['prometheus']}" in output
    assert "make -s container-token" in output and "key_file.json" in output
    grafana = subprocess.run(["docker", "image", "inspect", "grafana/grafana:11.2.2"], capture_output=True).returncode
    assert ("starting explain, prometheus, process-exporter without Grafana" in output) == (grafana != 0), output
    inspected = stack.inspect("explain")
    assert inspected["State"]["Health"]["Status"] == "healthy"
    assert inspected["Config"]["Image"] == stack.image
    mounts = {mount["Destination"]: mount for mount in inspected["Mounts"]}
    assert mounts["/srv/explain/models"]["RW"] is False and mounts["/srv/explain/models"]["Source"] == str(
        support.ARCHIVE_CACHE
    )


def test_rest_and_grpc_predictions_with_relevance(stack: Stack, token: str) -> None:
    reference = _reference_relevance(target=2)
    document = {"text": TEXT, "explain": {"method": "relevance", "target": 2}}
    status, reply = _rest(stack, "sentiment", document, token)
    assert status == 200, reply
    rest_explanation = reply["explanation"]
    assert rest_explanation["method"] == "relevance" and rest_explanation["target_label"] == "positive"
    torch.testing.assert_close(
        torch.tensor(rest_explanation["scores"]), reference.scores[0].float(), rtol=1e-3, atol=1e-5
    )
    grpc_reply = json.loads(_grpc(stack, "sentiment", document, token))
    assert grpc_reply["explanation"]["method"] == "relevance"
    torch.testing.assert_close(
        torch.tensor(grpc_reply["explanation"]["scores"]), reference.scores[0].float(), rtol=1e-3, atol=1e-5
    )
    status, reply = _rest(stack, "digits", {"image": _png_b64(), "explain": {"method": "relevance"}}, token)
    assert status == 200 and reply["explanation"]["method"] == "relevance", reply


def test_no_token_is_refused_on_rest_and_grpc(stack: Stack) -> None:
    status, reply = _rest(stack, "sentiment", {"text": TEXT}, None)
    assert status in (400, 401, 403) and "Token" in json.dumps(reply), (status, reply)
    status, reply = _rest(stack, "sentiment", {"text": TEXT}, "not-the-key")
    assert status in (400, 401, 403) and "explanation" not in json.dumps(reply)
    with pytest.raises(grpc.RpcError) as refused:
        _grpc(stack, "sentiment", {"text": TEXT}, None)
    assert refused.value.code() != grpc.StatusCode.OK


def test_only_inference_and_prometheus_are_published_and_private_ports_unreachable(stack: Stack) -> None:
    inspected = stack.inspect("explain")
    published = {
        int(port.split("/")[0]): [(binding["HostIp"], int(binding["HostPort"])) for binding in bindings]
        for port, bindings in inspected["NetworkSettings"]["Ports"].items()
        if bindings
    }
    assert published == {
        8080: [("127.0.0.1", stack.ports["rest"])],
        7070: [("127.0.0.1", stack.ports["grpc"])],
        9090: [("127.0.0.1", stack.ports["prometheus"])],
    }, published
    address = container_ip(inspected)
    assert connects(address, 8080) and connects(address, 7070), "control: inference must answer on the container IP"
    reachable = [port for port in PRIVATE_PORTS if connects(address, port)]
    assert not reachable, f"ports {reachable} of the container are reachable from the host at {address}"
    # ... and they are really served, on the container's loopback.
    script = (
        "import socket, sys\n"
        "for port in map(int, sys.argv[1:]):\n"
        "    socket.create_connection(('127.0.0.1', port), timeout=3).close()\n"
    )
    stack.exec("explain", "python", "-c", script, *map(str, PRIVATE_PORTS))


def test_runs_as_the_unprivileged_user_with_the_capabilities_dropped(stack: Stack) -> None:
    """Every process in the service's pid namespace (TorchServe's frontend, its workers, the metrics exporter, and
    the process exporter, which joins that namespace) runs without a capability and with no-new-privileges; the
    service's own as ``explain`` (uid 10001), the process exporter as nobody. The companions are hardened too."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    inspected = stack.inspect("explain")
    assert inspected["Config"]["User"] == "explain"
    for name in ("explain", "prometheus", "process-exporter"):
        host = stack.inspect(name)["HostConfig"]
        assert host["CapDrop"] == services[name]["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in host["SecurityOpt"], name
    script = (
        "import os, json\n"
        "rows = []\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        status = dict(l.split(':', 1) for l in open(f'/proc/{pid}/status').read().splitlines() if ':' in l)\n"
        "        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode()\n"
        "    except OSError:\n"
        "        continue\n"
        "    rows.append({'cmd': cmd, 'uid': status['Uid'].split(), 'capeff': status['CapEff'].strip(),\n"
        "                 'capprm': status['CapPrm'].strip(), 'nnp': status['NoNewPrivs'].strip()})\n"
        "print(json.dumps(rows))\n"
    )
    processes = json.loads(stack.exec("explain", "python", "-c", script))
    commands = " | ".join(process["cmd"] for process in processes)
    for expected in (
        "org.pytorch.serve.ModelServer",
        "model_service_worker",
        "doors.torchserve.exporter",
        "process-exporter",
    ):
        assert expected in commands, (expected, commands)
    for process in processes:
        uid = "65534" if "process-exporter" in process["cmd"] else "10001"
        assert set(process["uid"]) == {uid}, process
        assert int(process["capeff"], 16) == int(process["capprm"], 16) == 0, process
        assert process["nnp"] == "1", process


def _traffic(stack: Stack, token: str) -> None:
    """A few explanations of several methods on every default model, plus one refused row (an error code)."""
    for method in ("relevance", "rollout", "attention", "grad_x_input"):
        status, reply = _rest(stack, "sentiment", {"text": TEXT, "explain": {"method": method}}, token)
        assert status == 200, reply
    status, reply = _rest(stack, "digits", {"image": _png_b64(), "explain": {"method": "relevance"}}, token)
    assert status == 200, reply
    status, reply = _rest(stack, "entities", {"text": "john smith flew to london", "explain": {}}, token)
    assert status == 200 and "entities" in reply, reply
    assert _rest(stack, "sentiment", {"text": TEXT, "explain": {"method": "lime"}}, token)[0] == 400
    json.loads(_grpc(stack, "sentiment", {"text": TEXT, "explain": {"method": "relevance"}}, token))


def _concrete(expression: str) -> str:
    """A dashboard expression with Grafana's variables replaced as Grafana does for "All" and a 15 s interval."""
    return expression.replace("$__rate_interval", RATE_INTERVAL).replace("$model", ".*")


def _has_data(answer: dict[str, Any]) -> bool:
    """Whether an instant query answered at least one finite value."""
    if answer.get("status") != "success":
        return False
    return any(math.isfinite(float(item["value"][1])) for item in answer["data"]["result"])


def _panels(port: int) -> tuple[list[Any], list[str]]:
    """Every dashboard panel's queries against the stack's Prometheus: (failed queries, titles of panels none of
    whose queries returned a finite value, leaving out panels whose queries may all rightly be empty after a little
    traffic: drift and canaries, tests/metric_names.py)."""
    errors, empty = [], []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        answers = []
        for target in panel["targets"]:
            answer = prometheus_query(port, _concrete(target["expr"]))
            if answer.get("status") != "success":
                errors.append((panel["title"], target["expr"], answer))
            answers.append(_has_data(answer))
        if not any(answers) and not all(may_be_empty_after_traffic(target["expr"]) for target in panel["targets"]):
            empty.append(panel["title"])
    return errors, empty


@pytest.fixture(scope="module")
def scraped(stack: Stack, token: str) -> float:
    """Traffic, a scrape of it, more traffic, and the next scrapes (every rate() window then holds an increase);
    returns the seconds waited for the second part."""
    _traffic(stack, token)
    port = stack.ports["prometheus"]
    first = wait_until(lambda: _has_data(prometheus_query(port, "explain_stage_seconds_count")), SCRAPE_WAIT)
    assert first, f"Prometheus in the stack never scraped explain_stage_seconds; logs:\n{stack.logs()}"
    started = time.monotonic()
    _panels_during_traffic(stack, token)  # the dashboard test asserts (with the details)
    return time.monotonic() - started


def _panels_during_traffic(stack: Stack, token: str) -> tuple[list[Any], list[str]]:
    """The dashboard's panels, polled while traffic keeps flowing until every panel has data (or SCRAPE_WAIT passes).

    Rate panels need an increase between two scrapes inside their window: a quantile of rates that are all zero is
    NaN (no data), so the traffic must go on while the scrapes come in, as in production.
    """
    port = stack.ports["prometheus"]

    def traffic_then_panels() -> tuple[list[Any], list[str]] | None:
        _traffic(stack, token)
        panels = _panels(port)
        return None if panels != ([], []) else panels

    return wait_until(traffic_then_panels, SCRAPE_WAIT, interval=3.0) or _panels(port)


def test_prometheus_in_the_stack_scraped_explain_stage_seconds_by_method(stack: Stack, scraped: float) -> None:
    port = stack.ports["prometheus"]
    answer = prometheus_query(port, "sum by (method, stage) (explain_stage_seconds_count)")
    methods = {item["metric"].get("method") for item in answer["data"]["result"]}
    assert {"relevance", "rollout", "attention", "grad_x_input"} <= methods, answer
    targets = prometheus_get(port, "/api/v1/targets")["data"]["activeTargets"]
    health = {target["labels"]["job"]: target["health"] for target in targets}
    assert health == {"explanations": "up", "torchserve": "up", "worker-processes": "up"}, health


def test_the_alert_rules_load(stack: Stack) -> None:
    groups = prometheus_get(stack.ports["prometheus"], "/api/v1/rules")["data"]["groups"]
    loaded = {rule["name"]: rule for group in groups for rule in group["rules"]}
    expected = {rule_name(rule) for rule in rules()}
    assert set(loaded) == expected, loaded
    assert all(rule["health"] in ("ok", "unknown") for rule in loaded.values()), loaded


def test_every_dashboard_expression_evaluates_and_every_panel_has_data(
    stack: Stack, token: str, scraped: float
) -> None:
    port = stack.ports["prometheus"]
    document = json.loads(DASHBOARD.read_text())
    template = document["templating"]["list"][0]["query"]["query"]
    match = re.fullmatch(r"label_values\((\w+), (\w+)\)", template)
    assert match, template
    values = prometheus_get(port, f"/api/v1/label/{match.group(2)}/values?match[]={match.group(1)}")["data"]
    assert set(DEFAULT_MODELS) <= set(values), values  # the $model variable's choices
    errors, empty = _panels_during_traffic(stack, token)
    assert not errors, errors
    # A panel none of whose queries can return data after traffic is a defect (latency, throughput, errors, ...).
    assert not empty, f"panels with no data after traffic: {empty}"


def test_the_process_exporter_reports_each_workers_resident_memory(stack: Stack, scraped: float) -> None:
    port = stack.ports["prometheus"]
    answer = prometheus_query(port, 'namedprocess_namegroup_memory_bytes{memtype="resident"}')
    memory = {item["metric"]["groupname"]: float(item["value"][1]) for item in answer["data"]["result"]}
    script = (
        "import os, re\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode()\n"
        "    except OSError:\n"
        "        continue\n"
        "    found = re.search(r'model_service_worker\\.py.*\\.ts\\.sock\\.(\\d+)', cmd)\n"
        "    if found:\n"
        "        print(found.group(1))\n"
    )
    sockets = set(stack.exec("explain", "python", "-c", script).split())
    assert len(sockets) == len(DEFAULT_MODELS), sockets  # the cpu profile: one worker per model
    workers = {f"torchserve-worker-{socket}" for socket in sockets}
    assert workers | {"torchserve-frontend"} <= set(memory), memory
    assert all(memory[name] > 20 * 2**20 for name in workers), memory  # a Python worker with torch: tens of MiB


def test_down_leaves_no_container_and_a_second_up_reuses_the_image(stack: Stack) -> None:
    image = support.image_id(stack.image)
    stack.make("container-down", support.DOWN_TIMEOUT)
    assert stack.containers() == [], "containers left after make container-down"
    started = time.monotonic()
    output = stack.make("container-up", support.WARM_UP_TIMEOUT)
    seconds = time.monotonic() - started
    assert support.image_id(stack.image) == image
    steps = re.split(r"^(?=Step \d+/\d+ : )", output, flags=re.MULTILINE)[1:]
    rerun = [step.splitlines()[0] for step in steps if re.match(r"Step \S+ : (RUN|COPY)", step)
             and " ---> Using cache" not in step]  # fmt: skip
    assert steps and not rerun, f"the second build ran steps again: {rerun}"
    logger.warning("second make container-up (image reused): %.1f s", seconds)
    assert stack.inspect("explain")["State"]["Health"]["Status"] == "healthy"
