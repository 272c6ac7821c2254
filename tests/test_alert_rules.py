"""The Prometheus rules of ``deploy/prometheus/``: ``promtool check rules`` on every rule file the stack loads,
``promtool test rules`` on every unit-test file (``*_test.yml``: input series and the alerts they must raise), one
latency objective per registered method, the server-error codes of the error ratio, and metric names that exist.

promtool comes from Debian's ``prometheus`` package (``scripts/system_setup.py`` installs it for ``make test``);
where it is absent the promtool tests are skipped with one line.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from explainers import available_methods
from monitoring.metrics import METRIC_NAMES
from serving_core.errors import ERROR_TABLE
from serving_core.metrics import PREDICTION
from tests.metric_names import (
    DEPLOY,
    dashboard_expressions,
    expression_metrics,
    known_metric_names,
    rule_files,
    rules,
)

PROMETHEUS_DIR = DEPLOY / "prometheus"
UNIT_TESTS = sorted(PROMETHEUS_DIR.glob("*_test.yml"))
OBJECTIVE = "method:explain_seconds:p99_objective"
COVERAGE = "model_method:explain_coverage:ratio_rate5m"


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip(
            "promtool is missing: install Debian's prometheus package (make test does: scripts/system_setup.py)"
        )
    return promtool


def _alerts() -> dict[str, dict[str, object]]:
    return {str(rule["alert"]): rule for rule in rules() if "alert" in rule}


@pytest.mark.parametrize("path", rule_files(), ids=lambda path: path.name)
def test_promtool_checks_the_rule_file(path: Path) -> None:
    result = subprocess.run([_promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_rule_file_has_unit_tests_and_every_unit_test_file_tests_loaded_rules() -> None:
    assert UNIT_TESTS, "no deploy/prometheus/*_test.yml"
    tested = {PROMETHEUS_DIR / name for path in UNIT_TESTS for name in yaml.safe_load(path.read_text())["rule_files"]}
    assert tested == set(rule_files())


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda path: path.name)
def test_promtool_unit_tests_of_the_rules_pass(path: Path) -> None:
    result = subprocess.run(
        [_promtool(), "test", "rules", path.name], cwd=path.parent, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_exercise_every_new_alert() -> None:
    """Each alert of issue 37 (drift, canaries, error ratio, latency objectives) and the restart alert is both
    raised and held back by an alert_rule_test case."""
    cases = [
        case
        for path in UNIT_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for alert in (
        "ExplainAttributionDrift",
        "ExplainCanaryExplanationChanged",
        "ExplainCanaryPredictionChanged",
        "ExplainErrorRatioHigh",
        "ExplainLatencyObjectiveMissed",
        "ExplainProcessRestarted",
    ):
        assert alert in _alerts()
        outcomes = {bool(case["exp_alerts"]) for case in cases if case["alertname"] == alert}
        assert outcomes == {True, False}, f"{alert}: no case where it fires and one where it does not"


def test_the_drift_alert_is_ndcg_below_0_9_for_15_minutes() -> None:
    rule = _alerts()["ExplainAttributionDrift"]
    assert re.fullmatch(r"explain_attribution_ndcg\s*<\s*0\.9", str(rule["expr"]).strip()), rule
    assert rule["for"] == "15m"


def test_every_method_and_the_prediction_has_one_latency_objective() -> None:
    objectives = [rule for rule in rules() if rule.get("record") == OBJECTIVE]
    methods = [rule["labels"]["method"] for rule in objectives]  # type: ignore[index]
    assert len(methods) == len(set(methods)), f"a method with two objectives: {methods}"
    assert set(methods) == {*available_methods(), PREDICTION}
    for rule in objectives:
        seconds = re.fullmatch(r"vector\(([0-9.]+)\)", str(rule["expr"]))
        assert seconds and float(seconds.group(1)) > 0, rule
    assert OBJECTIVE in str(_alerts()["ExplainLatencyObjectiveMissed"]["expr"])


def test_the_error_ratio_counts_exactly_the_server_side_codes() -> None:
    """The ratio's numerator is the error table's 5xx codes: a new server-side code joins it or this fails."""
    ratio = next(rule for rule in rules() if rule.get("record") == "model:explain_server_errors:ratio_rate5m")
    match = re.search(r'code=~"([^"]+)"', str(ratio["expr"]))
    assert match, ratio
    server_side = {code for code, kind in ERROR_TABLE.items() if kind.http_status >= 500}
    assert set(match.group(1).split("|")) == server_side


def test_rules_and_dashboard_name_only_exported_metrics() -> None:
    known = known_metric_names()
    for rule in rules():
        unknown = expression_metrics(str(rule["expr"])) - known
        assert not unknown, f"{rule}: unknown metrics {sorted(unknown)}"
    for expression in dashboard_expressions():
        unknown = expression_metrics(expression) - known
        assert not unknown, f"{expression}: unknown metrics {sorted(unknown)}"


def test_the_dashboard_shows_every_monitor_metric() -> None:
    """Drift, canaries, health and coverage each have a panel: every monitor metric is queried somewhere."""
    used = set().union(*(expression_metrics(expression) for expression in dashboard_expressions()))
    suffixes = ("", "_sum", "_count", "_bucket")
    # the monitor's own queue counter (rows dropped when its queue is full) is the monitor's health, not the model's
    shown = [name for name in METRIC_NAMES if name != "explain_monitor_dropped_rows_total"]
    missing = [name for name in shown if not any(name + suffix in used for suffix in suffixes)]
    assert missing == []
    document = json.loads((DEPLOY / "grafana" / "dashboards" / "explanation-service.json").read_text())
    titles = " | ".join(panel["title"].lower() for panel in document["panels"])
    for topic in ("drift", "canar", "health", "coverage", "objective"):
        assert topic in titles, f"no panel about {topic}: {titles}"


def test_the_name_check_catches_an_unknown_metric() -> None:
    assert expression_metrics("sum(rate(explain_made_up_total[5m])) > on (method) group_left () up") == {
        "explain_made_up_total",
        "up",
    }
    assert "explain_made_up_total" not in known_metric_names()
    assert {"explain_seconds_bucket", "explain_errors_total", "explain_attribution_ndcg"} <= known_metric_names()


def test_coverage_is_recorded_across_every_worker_and_shown_on_the_dashboard() -> None:
    """Coverage is Prometheus's ratio of every worker's counters (an explanation pool's rows count under its model's
    name), recorded once and unit-tested on a pooled model; the dashboard shows the same ratio."""
    rule = next(rule for rule in rules() if rule.get("record") == COVERAGE)
    expression = " ".join(str(rule["expr"]).split())
    assert expression_metrics(expression) == {"explain_explanations_total"}
    numerator, denominator = expression.split(" / ")
    assert 'method!="none"' in numerator and "by (model, method)" in numerator
    assert "method" not in denominator.split("group_left ()")[1].replace("by (model)", "")
    tested = [
        case["expr"]
        for path in UNIT_TESTS
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("promql_expr_test", [])
    ]
    assert COVERAGE in tested
    panel = next(
        panel
        for panel in json.loads((DEPLOY / "grafana" / "dashboards" / "explanation-service.json").read_text())["panels"]
        if "coverage" in panel["title"].lower()
    )
    shown = " ".join(target["expr"] for target in panel["targets"])
    assert expression_metrics(shown) == {"explain_explanations_total"}
    assert 'method!="none"' in shown and "group_left" in shown
