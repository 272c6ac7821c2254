"""The time estimate against the actual time for the token-level tasks, in one run (``python -m bench.timing_tasks``):
a token classifier explaining every entity of a text, and a causal LM writing and explaining every step.

For each model the speed is measured once as the service does at load (:meth:`explainers.ModelSpeed.measure`, safety
factor included; a causal LM's at ``max_length + max_new_tokens`` with its cached step). Then each (method, length)
is run ``--repeats`` times and the slowest time compared with the estimate the service admits the row with:

* entities: :func:`explainers.explain_tokens` of one text, estimated for the entities a prediction finds
  (``targets``);
* generation: :func:`explainers.explain_generation` of one prompt writing ``new`` tokens, estimated for writing them
  (:func:`explainers.timing.generation_seconds`) and explaining every step (``targets = new``).

The report gives ``actual / estimate`` per case, and per model its median and maximum (the goal: a median of at least
0.3, every case at most 1.0), twice: at the probe (``ratio``), and at the speed a server keeps up to date from the
batches it serves (``served_ratio``: each case's repeats estimated at a :class:`explainers.ServedSpeed` that every
run before it, of every case of the model, corrected; a case's worst repeat).

**Slow probe** (``--slow-probe 8``, the default; 0 leaves it out): the speed a server corrects by the batches it serves
(:class:`explainers.ServedSpeed`) starting from a probe made that many times too slow on purpose (as a probe measured
while other models load is), for a sentiment classifier (``explain_batch`` of ``--rows`` 17-token rows, as the issue's
concurrency run), the token classifier and the causal LM (``--rows`` rows each): ``--batches`` batches served one after
the other, each estimated at the served speed of that moment (the sum of its rows' estimates) and then handed its actual
time (a causal LM's writing and its explanation each, as the service hands them). The report gives each batch's
``actual / estimate``: the first at the slow probe, the following ones corrected; the summary's median and maximum leave
out the first ``--settle`` batches.

``--models default`` uses ``model_store/build/sentiment``, ``model_store/build/entities`` and
``model_store/build/writer`` (``make models``, ``make writer``); ``tiny`` builds tiny ones from configs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from explainers import (
    ModelSpeed,
    RowRequest,
    ServedSpeed,
    describe,
    estimate_seconds,
    explain_batch,
    explain_continuation,
    explain_generation,
    explain_tokens,
    generate_continuation,
    get_method,
    predict_tokens,
    supported_methods,
)
from explainers.served_speed import scaled, work_kind
from explainers.timing import generation_seconds

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILT = REPO_ROOT / "model_store" / "build"
SENTENCE = "john smith flew from paris to london with mary jones of acme corp on monday and the crew was rude"
WORDS = SENTENCE.split(" ")
#: The methods whose options decide their cost run at these (their defaults take long on the built models).
EXTRA_OPTIONS: dict[str, dict[str, Any]] = {"integrated_gradients": {"n_steps": 16}, "smoothgrad": {"n_samples": 8}}


def _text(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def load(kind: str, which: str) -> tuple[Any, Any, str]:
    """The model and tokenizer of ``kind`` (``sentiment``, ``entities`` or ``writer``): the built one, or a tiny
    one."""
    loaders: dict[str, Any] = {
        "sentiment": AutoModelForSequenceClassification,
        "entities": AutoModelForTokenClassification,
        "writer": AutoModelForCausalLM,
    }
    loader = loaders[kind]
    if which == "default":
        folder = BUILT / kind / "model"
        if not (folder / "config.json").is_file():
            raise SystemExit(f"{folder} is not built: run make models / make writer, or use --models tiny")
    else:
        from tests import checkpoints
        from tests.generation_checkpoint import causal_lm

        builders: dict[str, Any] = {
            "sentiment": checkpoints.generic_labels,
            "entities": checkpoints.token_classifier,
            "writer": causal_lm,
        }
        folder = builders[kind](Path(tempfile.mkdtemp()) / kind)
    model = loader.from_pretrained(str(folder)).eval()
    return model, AutoTokenizer.from_pretrained(str(folder)), f"{kind} ({which}: {folder})"


def _case(
    method: str, length: int, targets: int, estimate: float, times: list[float], served: list[float]
) -> dict[str, Any]:
    """One case: the probe's estimate against the slowest time, and the served speed's worst ``actual / estimate``."""
    actual = max(times)
    return {"method": method, "length": length, "targets": targets, "estimate_s": round(estimate, 4),
            "actual_s": round(actual, 4), "ratio": round(actual / estimate, 3),
            "served_ratio": round(max(served), 3) if served else None}  # fmt: skip


def _served_run(served: ServedSpeed, work: dict[str, float], length: int, run: Any) -> tuple[float, float | None]:
    """Run ``run()`` as a server would at ``served``'s speed: ``work`` (kind: estimate at the probe's speed, factor 1)
    corrected to the served speed, the run's seconds handed back; the seconds and ``actual / estimate`` (``None``
    before any batch was served: the probe's own estimate)."""
    ledger = served.ledger()
    corrected = 0.0
    for kind, seconds in work.items():
        factor = served.factor(kind, length)
        ledger.speed(kind, length)  # read the kind's factor for the ledger
        ledger.add(kind, seconds * factor, length)
        corrected += seconds * factor
    observed = served.batches > 0
    started = time.perf_counter()
    run()
    actual = time.perf_counter() - started
    ledger.settle(actual)
    return actual, (actual / corrected if observed else None)


def entities_cases(model: Any, tokenizer: Any, words: list[int], repeats: int) -> list[dict[str, Any]]:
    """Every method on texts of ``words`` words, each estimated for its predicted entities."""
    arch = describe(model)
    speed = ModelSpeed.measure(model, arch, 128)
    served = ServedSpeed(speed)
    cases = []
    for method in supported_methods(arch.model_type, "token_classification"):
        options: dict[str, Any] = EXTRA_OPTIONS.get(method, {})
        for count in words:
            inputs = dict(tokenizer([_text(count)], return_tensors="pt", truncation=True, max_length=128,
                                    return_special_tokens_mask=True))  # fmt: skip
            length = int(inputs["input_ids"].shape[1])
            targets = max(len(predict_tokens(model, inputs).spans[0]), 1)
            resolved = get_method(method).resolve_options(options, arch)
            estimate = estimate_seconds(speed, method, length, resolved, targets=targets)
            times, ratios = [], []
            for _ in range(repeats):
                seconds, ratio = _served_run(
                    served,
                    {work_kind(method, resolved): estimate},
                    length,
                    partial(explain_tokens, model, inputs, method=method, **options),
                )
                times.append(seconds)
                ratios += [] if ratio is None else [ratio]
            cases.append(_case(method, length, targets, estimate, times, ratios))
    return cases


def writer_cases(model: Any, tokenizer: Any, new_tokens: list[int], repeats: int) -> list[dict[str, Any]]:
    """Every method writing ``new_tokens`` tokens after a 16-word prompt, every step explained."""
    arch = describe(model)
    speed = ModelSpeed.measure(model, arch, 64 + max(new_tokens))
    served = ServedSpeed(speed)
    inputs = dict(tokenizer([_text(16)], return_tensors="pt"))
    prompt = int(inputs["input_ids"].shape[1])
    cases = []
    for method in supported_methods(arch.model_type, "causal_lm"):
        options: dict[str, Any] = EXTRA_OPTIONS.get(method, {})
        resolved = get_method(method).resolve_options(options, arch)
        for new in new_tokens:
            writing = generation_seconds(speed, prompt, new)
            explaining = estimate_seconds(speed, method, prompt + new, resolved, targets=new)
            times, ratios = [], []
            for _ in range(repeats):
                seconds, ratio = _served_run(
                    served,
                    {ServedSpeed.GENERATE: writing, work_kind(method, resolved): explaining},
                    prompt + new,
                    partial(explain_generation, model, inputs, method=method, max_new_tokens=new, **options),
                )
                times.append(seconds)
                ratios += [] if ratio is None else [ratio]
            cases.append(_case(method, prompt + new, new, writing + explaining, times, ratios))
    return cases


def slow_probe_cases(
    kind: str, model: Any, tokenizer: Any, slowdown: float, batches: int, rows: int
) -> list[dict[str, Any]]:
    """``batches`` batches of ``rows`` rows served one after the other from a probe ``slowdown`` times too slow,
    corrected by each batch's actual time (:class:`explainers.ServedSpeed`): each batch's estimate and actual time."""
    arch = describe(model)
    method = "attnlrp"
    resolved = get_method(method).resolve_options({}, arch)
    work = work_kind(method, resolved)
    longest = 64 + 8 if kind == "writer" else 128
    served = ServedSpeed(scaled(ModelSpeed.measure(model, arch, longest), slowdown))
    cases = []
    for number in range(batches):
        ledger = served.ledger()
        if kind == "sentiment":
            inputs = dict(tokenizer([_text(15)] * rows, return_tensors="pt", padding=True))
            length = int(inputs["input_ids"].shape[1])
            estimate = rows * estimate_seconds(ledger.speed(work, length), method, length, resolved)
            requests = [RowRequest(method)] * rows
            started = time.perf_counter()
            explain_batch(model, inputs, requests, time_budget_s=1e9, speed=served)  # settles its own ledger
            actual = time.perf_counter() - started
        elif kind == "entities":
            inputs = dict(tokenizer([_text(40)] * rows, return_tensors="pt", return_special_tokens_mask=True))
            length = int(inputs["input_ids"].shape[1])
            targets = [max(len(spans), 1) for spans in predict_tokens(model, inputs).spans]
            speed = ledger.speed(work, length)
            estimate = sum(estimate_seconds(speed, method, length, resolved, targets=t) for t in targets)
            ledger.add(work, estimate, length)
            started = time.perf_counter()
            explain_tokens(model, inputs, method=method)
            actual = time.perf_counter() - started
            ledger.settle(actual)
        else:  # as the service does: the writing, then the explanation of what was written, each settled
            new = 8
            inputs = dict(tokenizer([_text(16)] * rows, return_tensors="pt"))
            prompt = int(inputs["input_ids"].shape[1])
            length = prompt + new
            writing = rows * generation_seconds(ledger.speed(ServedSpeed.GENERATE, length), prompt, new)
            ledger.add(ServedSpeed.GENERATE, writing, length)
            started = time.perf_counter()
            made = generate_continuation(model, inputs, new)
            written = time.perf_counter() - started
            ledger.settle(written)
            explaining_ledger = served.ledger()
            speed = explaining_ledger.speed(work, length)
            explaining = rows * estimate_seconds(speed, method, length, resolved, targets=new)
            explaining_ledger.add(work, explaining, length)
            started = time.perf_counter()
            explain_continuation(model, made, method=method)
            explained = time.perf_counter() - started
            explaining_ledger.settle(explained)
            estimate, actual = writing + explaining, written + explained
        cases.append({"batch": number, "rows": rows, "estimate_s": round(estimate, 4), "actual_s": round(actual, 4),
                      "ratio": round(actual / estimate, 3)})  # fmt: skip
    return cases


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print the report (JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny", help="tiny or default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--words", default="8,40,100", help="entities: text lengths in words")
    parser.add_argument("--new", default="8,32", help="generation: new tokens")
    parser.add_argument("--slow-probe", type=float, default=8.0, help="the probe made this many times too slow (0: no)")
    parser.add_argument("--batches", type=int, default=8, help="slow probe: batches served")
    parser.add_argument("--settle", type=int, default=1, help="slow probe: first batches left out of the summary")
    parser.add_argument("--rows", type=int, default=8, help="slow probe: rows per batch")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    report: dict[str, Any] = {"threads": args.threads, "repeats": args.repeats, "models": {}}
    for kind in ("entities", "writer"):
        model, tokenizer, label = load(kind, args.models)
        if kind == "entities":
            cases = entities_cases(model, tokenizer, [int(w) for w in args.words.split(",")], args.repeats)
        else:
            cases = writer_cases(model, tokenizer, [int(n) for n in args.new.split(",")], args.repeats)
        ratios = [case["ratio"] for case in cases]
        served = [case["served_ratio"] for case in cases if case["served_ratio"] is not None]
        report["models"][kind] = {"label": label, "cases": cases, "max_ratio": max(ratios),
                                  "median_ratio": statistics.median(ratios),
                                  "served_max_ratio": max(served, default=None),
                                  "served_median_ratio": statistics.median(served) if served else None}  # fmt: skip
        print(f"{label}: {len(cases)} cases, actual/estimate at the probe max {max(ratios):.3f}, median "
              f"{statistics.median(ratios):.3f}; at the served speed max {max(served, default=0):.3f}, median "
              f"{statistics.median(served) if served else 0:.3f}")  # fmt: skip
        for case in sorted(cases, key=lambda case: -case["ratio"])[:5]:
            print(
                f"  {case['method']:22s} n={case['length']:4d} targets={case['targets']:3d} "
                f"estimate {case['estimate_s']:8.3f} s actual {case['actual_s']:8.3f} s ratio {case['ratio']:.3f}"
            )
    if args.slow_probe > 0:
        report["slow_probe"] = {"slowdown": args.slow_probe, "settle": args.settle, "models": {}}
        for kind in ("sentiment", "entities", "writer"):
            model, tokenizer, label = load(kind, args.models)
            cases = slow_probe_cases(kind, model, tokenizer, args.slow_probe, args.batches, args.rows)
            later = [case["ratio"] for case in cases[args.settle :]] or [cases[-1]["ratio"]]
            report["slow_probe"]["models"][kind] = {
                "label": label, "batches": cases, "first_ratio": cases[0]["ratio"],
                "median_ratio": statistics.median(later), "max_ratio": max(later),
            }  # fmt: skip
            print(
                f"{label}: probe {args.slow_probe:g}x too slow, {len(cases)} batches of {args.rows}: first batch "
                f"actual/estimate {cases[0]['ratio']:.3f}; after {args.settle}: median {statistics.median(later):.3f}, "
                f"max {max(later):.3f}"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
