"""The time estimate against the actual time: every method at several lengths, on a tiny BERT and on the default
sentiment model's shape, in one run (``python -m bench.timing``).

For each model the speed is measured once as the service does at load (:meth:`explainers.ModelSpeed.measure`, safety
factor included); then each (method, options, length) is explained ``--repeats`` times at batch 1 with
:func:`explainers.explain` and the slowest time is compared with :func:`explainers.estimate_seconds`. The estimate
must err high: the report gives ``actual / estimate`` per case and its maximum (below 1 when every estimate held).

``--model default`` is ``model_store/build/sentiment/model`` when it is built, else the MiniLM checkpoint the recipe
fine-tunes (the same shape: the time does not depend on the weights' values).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from explainers import ModelSpeed, RowRequest, describe, estimate_seconds, explain, explain_batch, supported_methods

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The cases beyond each method's defaults: the options that decide the cost, at a few values.
EXTRA_OPTIONS: dict[str, list[dict[str, int]]] = {
    "integrated_gradients": [{"n_steps": 256}],
    "smoothgrad": [{"n_samples": 64}],
}


def load_model(name: str) -> tuple[Any, str]:
    """``tiny`` (a 2-layer BERT built from a config) or ``default`` (the sentiment model, or its MiniLM base)."""
    if name == "tiny":
        config = BertConfig(
            vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=512,
        )  # fmt: skip
        config.num_labels = 3
        return BertForSequenceClassification(config).eval(), "tiny BERT (2 layers, hidden 32)"
    built = REPO_ROOT / "model_store" / "build" / "sentiment" / "model"
    if name == "default" and (built / "config.json").is_file():
        return AutoModelForSequenceClassification.from_pretrained(str(built)).eval(), f"sentiment ({built})"
    if name == "default":
        from model_store.data import minilm_checkpoint_path

        path = minilm_checkpoint_path()
        model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=3).eval()
        return model, "MiniLM-L6 (the sentiment model's base and shape)"
    return AutoModelForSequenceClassification.from_pretrained(name).eval(), name


def row(model: Any, length: int) -> dict[str, torch.Tensor]:
    """One row of ``length`` ordinary token ids."""
    vocabulary = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(length)
    ids = torch.randint(min(100, vocabulary - 10), vocabulary, (1, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def measure(model: Any, label: str, lengths: Sequence[int], methods: Sequence[str], repeats: int) -> dict[str, Any]:
    """Every case of one model: its estimate, its actual time (slowest of ``repeats``) and their ratio."""
    arch = describe(model)
    speed = ModelSpeed.measure(model, arch, max(lengths))
    cases: list[dict[str, Any]] = []
    for method in methods:
        for options in [{}, *EXTRA_OPTIONS.get(method, [])]:
            chosen: dict[str, Any] = dict(options)
            for length in lengths:
                if method == "attention_flow" and length > 128:
                    continue
                estimate = estimate_seconds(speed, method, length, options)
                times = []
                for _ in range(repeats):
                    started = time.perf_counter()
                    explain(model, row(model, length), method, **chosen)
                    times.append(time.perf_counter() - started)
                actual = max(times)
                cases.append(
                    {"method": method, "options": options, "length": length, "actual_s": actual,
                     "estimate_s": estimate, "ratio": actual / estimate}
                )  # fmt: skip
                print(
                    f"{label[:24]:24} {method:21} {json.dumps(options):22} {length:5} "
                    f"{actual:9.3f} s {estimate:9.3f} s  {actual / estimate:5.2f}",
                    flush=True,
                )
    ratios = [case["ratio"] for case in cases]
    return {
        "model": label,
        "speed": {"call_s": speed.call, "token_s": speed.token},
        "threads": torch.get_num_threads(),
        "max_ratio": max(ratios),
        "median_ratio": sorted(ratios)[len(ratios) // 2],
        "cases": cases,
    }


def issue_scenario(model: Any, label: str, budget_s: float, longest: int) -> dict[str, Any]:
    """Issue 29's request: ``integrated_gradients`` with ``n_steps`` 1024 on a ~500-token text (truncated to
    ``longest``, the served ``max_length``) batched with a prediction, under the served default budget: the seconds
    to the refusal and the prediction's, against the prediction alone."""
    arch = describe(model)
    started = time.perf_counter()
    speed = ModelSpeed.measure(model, arch, longest)
    measuring = time.perf_counter() - started
    text = row(model, 500)
    inputs = {key: value[:, :longest].repeat(2, 1) for key, value in text.items()}
    expensive = RowRequest("integrated_gradients", options={"n_steps": 1024})
    alone = []
    for _ in range(3):
        began = time.perf_counter()
        explain_batch(model, inputs, [RowRequest(), RowRequest()], time_budget_s=budget_s, speed=speed)
        alone.append(time.perf_counter() - began)
    began = time.perf_counter()
    result = explain_batch(model, inputs, [expensive, RowRequest()], time_budget_s=budget_s, speed=speed)
    together = time.perf_counter() - began
    answer = {
        "model": label, "tokens": longest, "budget_s": budget_s, "speed_measure_s": measuring,
        "refusal": str(result.rows[0]), "batch_with_refusal_s": together, "predictions_alone_s": min(alone),
    }  # fmt: skip
    print(json.dumps(answer, indent=1))
    return answer


def main(argv: Sequence[str] | None = None) -> None:
    """Run the comparison (module docstring) and print (or write) the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,default", help="comma-separated: tiny, default or a checkpoint path")
    parser.add_argument("--lengths", default="16,64,128", help="comma-separated token counts")
    parser.add_argument("--methods", default="all", help="comma-separated method names (all: every supported one)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per case (the slowest is compared)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--issue", action="store_true", help="only issue 29's request (IG n_steps 1024, ~500 tokens) on --models"
    )
    parser.add_argument("--budget", type=float, default=30.0, help="--issue: the time budget (the served default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.issue:
        for name in args.models.split(","):
            model, label = load_model(name)
            issue_scenario(model, label, args.budget, 128)
        return
    lengths = [int(value) for value in args.lengths.split(",")]
    results = []
    for name in args.models.split(","):
        model, label = load_model(name)
        arch = describe(model)
        methods = supported_methods(arch.model_type) if args.methods == "all" else args.methods.split(",")
        print(f"{'model':24} {'method':21} {'options':22} {'n':>5} {'actual':>11} {'estimate':>11}  ratio")
        results.append(measure(model, label, lengths, methods, args.repeats))
        print(f"{label}: max actual/estimate {results[-1]['max_ratio']:.2f}, median {results[-1]['median_ratio']:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
