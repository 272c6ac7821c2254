"""The time estimate against the actual time for the token-level tasks, in one run (``python -m bench.timing_tasks``):
a token classifier explaining every entity of a text, and a causal LM writing and explaining every step.

For each model the speed is measured once as the service does at load (:meth:`explainers.ModelSpeed.measure`, safety
factor included; a causal LM's at ``max_length + max_new_tokens`` with its cached step). Then each (method, length)
is run ``--repeats`` times and the slowest time compared with the estimate the service admits the row with:

* entities: :func:`explainers.explain_tokens` of one text, estimated for the entities a prediction finds
  (``targets``);
* generation: :func:`explainers.explain_generation` of one prompt writing ``new`` tokens, estimated for writing them
  (:func:`explainers.timing.generation_seconds`) and explaining every step (``targets = new``).

The report gives ``actual / estimate`` per case and its maximum (below 1 when every estimate held). ``--models
default`` uses ``model_store/build/entities`` and ``model_store/build/writer`` (``make models``, ``make writer``);
``tiny`` builds tiny ones from configs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from explainers import (
    ModelSpeed,
    describe,
    estimate_seconds,
    explain_generation,
    explain_tokens,
    get_method,
    predict_tokens,
    supported_methods,
)
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
    """The model and tokenizer of ``kind`` (``entities`` or ``writer``): the built one, or a tiny one."""
    loader = AutoModelForTokenClassification if kind == "entities" else AutoModelForCausalLM
    if which == "default":
        folder = BUILT / kind / "model"
        if not (folder / "config.json").is_file():
            raise SystemExit(f"{folder} is not built: run make models / make writer, or use --models tiny")
    else:
        from tests import checkpoints
        from tests.generation_checkpoint import causal_lm

        build = checkpoints.token_classifier if kind == "entities" else causal_lm
        folder = build(Path(tempfile.mkdtemp()) / kind)
    model = loader.from_pretrained(str(folder)).eval()
    return model, AutoTokenizer.from_pretrained(str(folder)), f"{kind} ({which}: {folder})"


def _case(method: str, length: int, targets: int, estimate: float, times: list[float]) -> dict[str, Any]:
    actual = max(times)
    return {"method": method, "length": length, "targets": targets, "estimate_s": round(estimate, 4),
            "actual_s": round(actual, 4), "ratio": round(actual / estimate, 3)}  # fmt: skip


def entities_cases(model: Any, tokenizer: Any, words: list[int], repeats: int) -> list[dict[str, Any]]:
    """Every method on texts of ``words`` words, each estimated for its predicted entities."""
    arch = describe(model)
    speed = ModelSpeed.measure(model, arch, 128)
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
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                explain_tokens(model, inputs, method=method, **options)
                times.append(time.perf_counter() - started)
            cases.append(_case(method, length, targets, estimate, times))
    return cases


def writer_cases(model: Any, tokenizer: Any, new_tokens: list[int], repeats: int) -> list[dict[str, Any]]:
    """Every method writing ``new_tokens`` tokens after a 16-word prompt, every step explained."""
    arch = describe(model)
    speed = ModelSpeed.measure(model, arch, 64 + max(new_tokens))
    inputs = dict(tokenizer([_text(16)], return_tensors="pt"))
    prompt = int(inputs["input_ids"].shape[1])
    cases = []
    for method in supported_methods(arch.model_type, "causal_lm"):
        options: dict[str, Any] = EXTRA_OPTIONS.get(method, {})
        resolved = get_method(method).resolve_options(options, arch)
        for new in new_tokens:
            writing = generation_seconds(speed, prompt, new)
            estimate = writing + estimate_seconds(speed, method, prompt + new, resolved, targets=new)
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                explain_generation(model, inputs, method=method, max_new_tokens=new, **options)
                times.append(time.perf_counter() - started)
            cases.append(_case(method, prompt + new, new, estimate, times))
    return cases


def main(argv: list[str] | None = None) -> int:
    """Run the cases and print the report (JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny", help="tiny or default")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--words", default="8,40,100", help="entities: text lengths in words")
    parser.add_argument("--new", default="8,32", help="generation: new tokens")
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
        report["models"][kind] = {"label": label, "cases": cases, "max_ratio": max(ratios),
                                  "median_ratio": statistics.median(ratios)}  # fmt: skip
        print(f"{label}: {len(cases)} cases, actual/estimate max {max(ratios):.3f}, median "
              f"{statistics.median(ratios):.3f}")  # fmt: skip
        for case in sorted(cases, key=lambda case: -case["ratio"])[:5]:
            print(
                f"  {case['method']:22s} n={case['length']:4d} targets={case['targets']:3d} "
                f"estimate {case['estimate_s']:8.3f} s actual {case['actual_s']:8.3f} s ratio {case['ratio']:.3f}"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
