"""Where an explanation's time goes: stages and top operators, next to a plain forward (``torch.profiler``, CPU).

For the model of :mod:`bench.explainers` (the MiniLM checkpoint, or a random model of ``--arch``), one batch of
``--batch`` × ``--length`` tokens, it prints for each method of ``--methods``:

* the stages, median over ``--repeats`` calls: the capture's forward and gradient pass (the ``seconds`` the capture
  records), the method's attribution maths (``compute``) and the rest (validation, readout, switching the model),
  each as a multiple of a plain forward (``torch.inference_mode``, the model as loaded) timed in the same loop;
* the top ``--top`` operators of one profiled call by self CPU time (``torch.profiler``), with their share of the
  call, and the same for one plain forward, so the operators the method adds stand out.

Run with one thread (``OMP_NUM_THREADS=1``) on a shared machine, and read ratios, not milliseconds:

    OMP_NUM_THREADS=1 python -m bench.profile --methods attnlrp
    OMP_NUM_THREADS=1 python -m bench.profile --arch llama --methods gae rollout --top 15
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from bench.explainers import ARCHITECTURES, build_model, default_checkpoint, load_model, make_inputs
from explainers import describe, get_method
from explainers.architectures.attention import fused_implementation
from explainers.capture import bind_rules, prepared_model, run_capture
from explainers.execution import Readout
from explainers.inputs import token_mask, validate_inputs
from explainers.methods import MethodInputs


def staged(model: nn.Module, inputs: dict[str, torch.Tensor], method: str) -> dict[str, float]:
    """One explanation of ``inputs`` by ``method`` as :func:`explainers.explain` runs it, timed by stage (seconds)."""
    started = time.perf_counter()
    arch = describe(model)
    chosen = get_method(method)
    validated = validate_inputs(arch, model, inputs)
    mask = token_mask(arch, validated, model)
    readout = Readout.of(arch, model, validated, mask)
    fused = fused_implementation(model)
    with prepared_model(model):
        rules = bind_rules(chosen.rules, model, arch)
        capture = run_capture(
            model, arch, validated, chosen.needs, lambda logits: logits.argmax(-1), rules=rules, fused=fused
        )
        computing = time.perf_counter()
        options = chosen.resolve_options({}, arch)
        chosen.compute(
            MethodInputs(capture, arch, model, validated, mask, options, readout.weights, readout.tokens, fused=fused)
        )
        computed = time.perf_counter()
    total = time.perf_counter() - started
    stages = {"forward": capture.seconds.get("forward", 0.0), "gradient": capture.seconds.get("backward", 0.0)}
    stages["compute"] = computed - computing
    stages["rest"] = total - sum(stages.values())
    stages["total"] = total
    return stages


def operator_table(run: Callable[[], object], top: int) -> str:
    """The ``top`` operators of one call of ``run`` by self CPU time, with their share of the call."""
    run()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    events = prof.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    rows = sorted(events, key=lambda event: event.self_cpu_time_total, reverse=True)[:top]
    lines = [f"    {'operator':<44} {'calls':>6} {'self ms':>9} {'share':>6}"]
    for event in rows:
        share = event.self_cpu_time_total / total if total else 0.0
        lines.append(f"    {event.key[:44]:<44} {event.count:>6} {event.self_cpu_time_total / 1e3:>9.1f} {share:>6.1%}")
    lines.append(f"    {'(all operators)':<44} {'':>6} {total / 1e3:>9.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Print the stage table and the operator tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=ARCHITECTURES, help="a random model of this architecture (no checkpoint)")
    parser.add_argument("--methods", nargs="+", default=["attnlrp", "gae", "rollout", "relevance", "grad_x_input"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--top", type=int, default=12, help="operators shown per table")
    parser.add_argument("--no-operators", action="store_true", help="stage table only")
    args = parser.parse_args(argv)
    if args.arch:
        model = build_model(args.arch, 6, 384, 6, 1536, args.length)
    else:
        model = load_model(default_checkpoint(), "cpu")
    inputs = make_inputs(model, args.batch, args.length, "cpu")

    def forward() -> object:
        with torch.inference_mode():
            return model(**inputs).logits

    print(f"{args.arch or 'minilm'} batch {args.batch} x {args.length}, torch threads {torch.get_num_threads()}")
    print("| method | forward x | gradient x | compute x | rest x | total x |")
    print("|---|---|---|---|---|---|")
    for method in args.methods:
        staged(model, inputs, method)
        rows: list[dict[str, float]] = []
        for _ in range(args.repeats):
            base = time.perf_counter()
            forward()
            seconds = time.perf_counter() - base
            rows.append({key: value / seconds for key, value in staged(model, inputs, method).items()})
        cells = [f"{statistics.median(row[key] for row in rows):.2f}" for key in rows[0]]
        print(f"| {method} | " + " | ".join(cells) + " |")
    if args.no_operators:
        return
    print("\nplain forward (inference_mode, as loaded):")
    print(operator_table(forward, args.top))
    for method in args.methods:
        print(f"\n{method}:")
        print(operator_table(partial(staged, model, inputs, method), args.top))


if __name__ == "__main__":
    main()
