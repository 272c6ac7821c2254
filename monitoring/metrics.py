"""The monitor's metrics on the explanation exporter (``prometheus_client``, multiprocess mode as
:mod:`serving_core.metrics`: each TorchServe worker writes to ``$PROMETHEUS_MULTIPROC_DIR``, one exporter sums them).

Every worker monitors the rows it served itself, so each gauge says how the exporter combines the workers' values
(``multiprocess_mode``; ``live``: a dead worker's value is dropped):

- ``explain_attribution_ndcg``, ``explain_attribution_rank_correlation``, ``explain_attribution_mass_cosine``
  ``{model,method,label}``, ``explain_canary_agreement`` and ``explain_canary_prediction_agreement``
  ``{model,method}``: ``livemin``, the worst live worker's value (one series per label set, and an alert fires when
  any worker drifts);
- ``explain_attribution_window_rows{model,method,label}``: ``livesum``, the rows in all live workers' windows;
- ``explain_attribution_baseline_rows{model,method,label}``: ``livemax`` (a baseline file gives every worker the same
  count; a first-window baseline the largest);
- the health numbers ``explain_attribution_special_share``, ``explain_attribution_entropy`` (bits) and
  ``explain_attribution_negative_share`` ``{model,method}``: histograms of one value per explanation (summed over
  workers, as every histogram);
- ``explain_monitor_dropped_rows{model}``: rows the monitor dropped because its queue was full (a counter).

Coverage (explained rows over predicted rows) is no gauge here: a worker sees only the rows it served, and behind an
explanation pool the pool's workers serve the explained rows and the model's own the others, so no worker's ratio is
the model's. Every worker counts its rows in ``explain_explanations_total{model,method}`` (:mod:`serving_core.metrics`;
``none``: a prediction only; a pool's rows under its model's name), and Prometheus takes the ratio across all of
them: the recording rule ``model_method:explain_coverage:ratio_rate5m`` (``deploy/prometheus/alerts.yml``,
docs/MONITORING.md).

Label values: ``model`` the served model's name, ``method`` a registered method, ``label`` one of the model's labels
(entity types for token classifiers, ``all`` for generation) or ``other`` — never request text.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

SHARE_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
ENTROPY_BUCKETS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 10.0)

DRIFT = ["model", "method", "label"]
PER_METHOD = ["model", "method"]

NDCG = Gauge(
    "explain_attribution_ndcg",
    "nDCG@k of the window's attribution ranking scored by the baseline's shares (worst live worker)",
    DRIFT,
    multiprocess_mode="livemin",
)
RANK_CORRELATION = Gauge(
    "explain_attribution_rank_correlation",
    "Spearman rank correlation of window and baseline shares over the union of both top-k lists (worst live worker)",
    DRIFT,
    multiprocess_mode="livemin",
)
MASS_COSINE = Gauge(
    "explain_attribution_mass_cosine",
    "Images: cosine of the window's and the baseline's patch mass maps (worst live worker)",
    DRIFT,
    multiprocess_mode="livemin",
)
WINDOW_ROWS = Gauge(
    "explain_attribution_window_rows", "Explained rows in the drift window (all live workers)", DRIFT,
    multiprocess_mode="livesum",
)  # fmt: skip
BASELINE_ROWS = Gauge(
    "explain_attribution_baseline_rows", "Rows the drift baseline was built from", DRIFT, multiprocess_mode="livemax"
)
CANARY_AGREEMENT = Gauge(
    "explain_canary_agreement",
    "The worst canary probe's explanation similarity to its reference (1 = identical; worst live worker)",
    PER_METHOD,
    multiprocess_mode="livemin",
)
CANARY_PREDICTION_AGREEMENT = Gauge(
    "explain_canary_prediction_agreement",
    "Share of canary probes answered with their reference prediction (worst live worker)",
    PER_METHOD,
    multiprocess_mode="livemin",
)
SPECIAL_SHARE = Histogram(
    "explain_attribution_special_share",
    "Share of an explanation's absolute mass on special and template tokens",
    PER_METHOD,
    buckets=SHARE_BUCKETS,
)
ENTROPY = Histogram(
    "explain_attribution_entropy",
    "Entropy in bits of an explanation's shares over its words or patches (low: concentrated)",
    PER_METHOD,
    buckets=ENTROPY_BUCKETS,
)
NEGATIVE_SHARE = Histogram(
    "explain_attribution_negative_share",
    "Share of an explanation's absolute mass that is negative",
    PER_METHOD,
    buckets=SHARE_BUCKETS,
)
DROPPED = Counter("explain_monitor_dropped_rows", "Rows the monitor dropped: its queue was full", ["model"])

#: Every metric the monitor exports (a door reading its replicas' metrics re-exports them: replica_metrics.py).
METRICS = (
    NDCG, RANK_CORRELATION, MASS_COSINE, WINDOW_ROWS, BASELINE_ROWS, CANARY_AGREEMENT, CANARY_PREDICTION_AGREEMENT,
    SPECIAL_SHARE, ENTROPY, NEGATIVE_SHARE, DROPPED,
)  # fmt: skip

#: Every metric name the monitor exports (as the exporter shows them: counters get ``_total``).
METRIC_NAMES = tuple(metric._name + ("_total" if isinstance(metric, Counter) else "") for metric in METRICS)
