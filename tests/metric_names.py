"""The metric names the service exports, and the names a PromQL expression uses: what the checks of the dashboard
(``deploy/grafana/dashboards/explanation-service.json``) and of the Prometheus rules (``deploy/prometheus/``) compare.

Exported names come from the registries themselves: every collector defined in :mod:`serving_core.metrics` and in
the monitors' package ``monitoring`` (with the suffixes Prometheus adds: ``_total``, ``_bucket``, ``_sum``,
``_count``, ``_created``), the launcher's restart counter, TorchServe's own metrics (``doors/torchserve/metrics.yaml``)
and the series the recording rules write.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import yaml
from prometheus_client.metrics import MetricWrapperBase

from doors.torchserve.supervision import RESTARTS_METRIC
from serving_core import metrics

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY = REPO_ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "explanation-service.json"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"

#: Metrics that come from outside the service: the worker-memory exporter (compose) and the kubelet (Kubernetes).
EXTERNAL_METRICS = frozenset({"namedprocess_namegroup_memory_bytes", "container_memory_working_set_bytes", "up"})

#: Monitor metrics that have no series right after a little traffic, by design: drift needs a baseline and a full
#: window of explained rows; canaries need the model's canary set. A panel or rule of only these may be empty.
NEED_A_WINDOW_OR_CANARIES = frozenset(
    {
        "explain_attribution_ndcg",
        "explain_attribution_rank_correlation",
        "explain_attribution_window_rows",
        "explain_attribution_baseline_rows",
        "explain_attribution_mass_cosine",
        "explain_canary_agreement",
        "explain_canary_prediction_agreement",
    }
)

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
    "stateset": ("",),
    "enum": ("",),
}
_PROMQL_WORDS = {
    "sum", "by", "rate", "histogram_quantile", "le", "without", "avg", "max", "min", "delta", "irate", "increase",
    "on", "ignoring", "group_left", "group_right", "count", "and", "or", "unless", "bool", "offset", "vector",
    "topk", "bottomk", "clamp_min", "clamp_max", "abs", "avg_over_time", "min_over_time", "max_over_time",
}  # fmt: skip


def series_names(name: str, kind: str) -> set[str]:
    """The series names Prometheus sees for one metric family ``name`` of type ``kind``."""
    return {f"{name}{suffix}" for suffix in _SUFFIXES[kind]}


def collector_names(module: ModuleType) -> set[str]:
    """The series names of every prometheus-client collector defined at the top of ``module``."""
    names: set[str] = set()
    for value in vars(module).values():
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                names |= series_names(family.name, family.type)
    return names


def monitoring_metric_names() -> set[str]:
    """The monitors' series names, from the collectors of every module of the ``monitoring`` package."""
    package = importlib.import_module("monitoring")
    modules = [package]
    for info in pkgutil.walk_packages(package.__path__, prefix="monitoring."):
        modules.append(importlib.import_module(info.name))
    return set().union(*(collector_names(module) for module in modules))


def torchserve_metric_names() -> set[str]:
    """TorchServe's own metrics, as ``doors/torchserve/metrics.yaml`` configures them."""
    document = yaml.safe_load((REPO_ROOT / "doors" / "torchserve" / "metrics.yaml").read_text())
    names: set[str] = set()
    for section in ("ts_metrics", "model_metrics"):
        for entries in (document.get(section) or {}).values():
            names.update(entry["name"] for entry in entries)
    return names


def rule_files() -> list[Path]:
    """The rule files the stack's Prometheus loads (``rule_files`` of ``deploy/prometheus/prometheus.yml``)."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    return [PROMETHEUS_CONFIG.parent / name for name in config["rule_files"]]


def rules() -> list[dict[str, object]]:
    """Every rule (alerting and recording) of every loaded rule file."""
    return [
        rule for path in rule_files() for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]
    ]


def rule_name(rule: dict[str, object]) -> str:
    """An alerting rule's alert or a recording rule's series name (Prometheus's ``/api/v1/rules`` name)."""
    return str(rule.get("alert") or rule["record"])


def recorded_names() -> set[str]:
    """The series the recording rules write."""
    return {str(rule["record"]) for rule in rules() if "record" in rule}


def service_metric_names() -> set[str]:
    """Every series name the service exports: the explanation metrics (serving_core/metrics.py), the records
    writer's (records/writer.py), the monitors' (monitoring/), the launcher's restart counter
    (doors/torchserve/supervision.py) and TorchServe's (doors/torchserve/metrics.yaml)."""
    from records import writer

    restarts = series_names(RESTARTS_METRIC, "counter")
    exported = collector_names(metrics) | collector_names(writer) | monitoring_metric_names()
    return exported | restarts | torchserve_metric_names()


def known_metric_names() -> set[str]:
    """What an expression of the dashboard or the rules may name: the exported, external and recorded series."""
    return service_metric_names() | EXTERNAL_METRICS | recorded_names()


def expression_metrics(expression: str) -> set[str]:
    """Metric names used in a PromQL expression (identifiers that are not functions, keywords or labels)."""
    without_strings = re.sub(r'"[^"]*"', '""', expression)
    without_labels = re.sub(r"\{[^}]*\}", "{}", without_strings)
    without_by = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", without_labels)
    without_ranges = re.sub(r"\[[^\]]*\]", "[]", without_by)
    identifiers = set(re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b(?!\s*\()", without_ranges))
    return {name for name in identifiers if name not in _PROMQL_WORDS and not name.startswith("$")}


def dashboard_expressions() -> list[str]:
    """Every query expression of the dashboard's panels."""
    document = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in document["panels"] for target in panel["targets"]]


def may_be_empty_after_traffic(expression: str) -> bool:
    """Whether a query may rightly have no data after a little traffic: it names a drift or canary metric (a full
    window, a baseline or a canary set first)."""
    return bool(expression_metrics(expression) & NEED_A_WINDOW_OR_CANARIES)
