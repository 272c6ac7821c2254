"""Cost of explaining generated text, against generation alone and against Captum's ``LLMGradientAttribution``.

On a random causal LM built from a config (``--arch``, default a 4-layer Llama of width 256 with a 2,000-word
vocabulary and a word-level tokenizer built here), for every prompt length × new tokens × batch size:

- ``generate``: the median wall time of :func:`explainers.tasks.continuation.generate_continuation` (greedy, no EOS, so
  every row writes exactly ``T`` tokens); every other time is given as a ratio to it, timed just before it;
- each method: :func:`explainers.explain_generation` on that continuation (``continuation=``, so the ratio is the
  explanation's own cost: ``1 + ratio`` with the generation), every step explained (``T`` targets), and
  ``steps="sum"`` for ``grad_x_input`` (one objective, one backward);
- ``attention``/``rollout`` re-run per step: one explanation per step of its context alone (what a per-token
  library does), for the speed-up of one forward serving every step;
- Captum (``--captum``, pip ``captum``; the ``bench`` extra): ``LLMGradientAttribution`` with
  ``LayerGradientXActivation`` on the input embeddings, one prompt at a time (its API takes one), same model,
  prompt and continuation; the ratio ``captum / ours`` for ``grad_x_input`` and ``attnlrp``. Before timing, the
  numbers are compared in float64 at the first configuration: Captum's per-token attribution (gradient of each
  step's log-probability × the prompt embeddings) against ours for ``StepSum(t, t + 1)`` (that step's
  log-probability), and Captum's sequence attribution against ``steps="sum"``.

``--memory`` adds the peak resident memory (CPU) of generation and of each method at the row's prompt length, new
tokens and batch, each in a fresh child process: the growth of the process's peak RSS (``getrusage``) over what it
held with the model and prompts loaded (the explanations explain a random continuation of the same shape, so no
generation raises the peak before it is read).

    python -m bench.generation --captum                       # the issue's grid: P 64/256, T 16/64, batch 1/8
    python -m bench.generation --prompts 64 --new-tokens 16 --batch-sizes 1 --repeats 3 --captum
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from explainers import StepSum, explain_generation
from explainers.tasks.continuation import Continuation, generate_continuation

log = logging.getLogger("bench.generation")
METHODS = ("attention", "rollout", "gae", "grad_x_input", "attnlrp", "cp_lrp", "integrated_gradients")
FAST_OPTIONS: dict[str, dict[str, Any]] = {"integrated_gradients": {"n_steps": 8}}


def word_tokenizer(vocabulary: int) -> Any:
    """A word-level fast tokenizer: ids 0, 1, 2 are ``<unk>``, ``<pad>``, ``<eos>``, id ``i >= 3`` is the word
    ``w{i}`` (no special tokens added), so text ``"w5 w9"`` is ids ``[5, 9]`` exactly, which Captum's text input
    needs."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<pad>": 1, "<eos>": 2, **{f"w{index}": index for index in range(3, vocabulary)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>", padding_side="left"
    )


def build_model(arch: str, layers: int, hidden: int, heads: int, vocabulary: int, positions: int) -> nn.Module:
    """A random causal LM of ``arch`` with eager attention, in eval mode (weights from a fixed seed)."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    torch.manual_seed(0)
    common: dict[str, Any] = {
        "vocab_size": vocabulary,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": hidden * 3,
        "max_position_embeddings": positions,
        "pad_token_id": 1,
        "eos_token_id": 2,
        "bos_token_id": 0,
    }
    configs: dict[str, Callable[[], Any]] = {
        "llama": lambda: LlamaConfig(**common, num_key_value_heads=max(1, heads // 2)),
        "qwen2": lambda: Qwen2Config(**common, num_key_value_heads=max(1, heads // 2)),
        "mistral": lambda: MistralConfig(**common, num_key_value_heads=max(1, heads // 2)),
        "gpt2": lambda: GPT2Config(
            vocab_size=vocabulary, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=positions,
            pad_token_id=1, eos_token_id=2, bos_token_id=0,
        ),
    }  # fmt: skip
    config = configs[arch]()
    config._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(config)
    return model.eval()


def prompts(batch: int, length: int, vocabulary: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``batch`` random prompts of exactly ``length`` tokens (never the pad, BOS or EOS id)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocabulary, (batch, length), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def timed(run: Callable[[], object]) -> float:
    """Wall seconds of one call."""
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def paired_ratios(runs: dict[str, Callable[[], object]], base: Callable[[], object], repeats: int) -> dict[str, float]:
    """Per name, the median of ``run / base`` over ``repeats`` rounds; each round times every run once (in a rotating
    order), each right after a timing of ``base``, so the machine's drift cancels."""
    ratios: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_index in range(repeats):
        order = names[round_index % len(names) :] + names[: round_index % len(names)] if names else []
        for name in order:
            reference = timed(base)
            seconds = timed(runs[name])
            ratios[name].append(seconds / reference)
            # one line per timing: a cell cut short by a time limit still says what it measured
            log.info("  %s: %.3f s = %.2f x generation (%.3f s), load %.1f", name, seconds, seconds / reference,
                     reference, os.getloadavg()[0])  # fmt: skip
    return {name: statistics.median(values) for name, values in ratios.items()}


def captum_attribution(model: nn.Module, tokenizer: Any) -> Any:
    """Captum's ``LLMGradientAttribution`` with ``LayerGradientXActivation`` on the input embeddings."""
    from captum.attr import LayerGradientXActivation, LLMGradientAttribution

    embeddings: Any = getattr(model, "get_input_embeddings")()  # noqa: B009 (nn.Module's typing hides it)
    return LLMGradientAttribution(LayerGradientXActivation(model, embeddings), tokenizer)


def captum_run(attribution: Any, tokenizer: Any, made: Continuation) -> list[Any]:
    """Captum's attribution of each row's prompt and continuation, one prompt at a time."""
    from captum.attr import TextTokenInput

    results = []
    for row in range(made.prompt_ids.shape[0]):
        prompt = made.prompt_ids[row][made.prompt_mask[row].bool()]
        text = " ".join(f"w{int(token)}" for token in prompt)
        target = made.tokens[row][made.token_mask[row]]
        results.append(attribution.attribute(TextTokenInput(text, tokenizer), target=target))
    return results


def _worse(current: float, new: float) -> float:
    """The larger difference, NaN winning (``max`` would hide a NaN)."""
    return new if new != new or new > current else current


def compare_with_captum(model: nn.Module, tokenizer: Any, made: Continuation) -> dict[str, float]:
    """Largest differences, relative to the largest score, between Captum and ours (float64 copies of the model)."""
    import copy

    double = copy.deepcopy(model).double()
    captum = captum_run(captum_attribution(double, tokenizer), tokenizer, made)
    prompt_width = made.prompt_width
    per_step = 0.0
    batch = {"input_ids": made.prompt_ids, "attention_mask": made.prompt_mask}
    for step in range(made.steps):
        ours = explain_generation(
            double, batch, method="grad_x_input", continuation=made.tokens, steps=StepSum(step, step + 1)
        ).scores[:, 0, :prompt_width]
        for row, result in enumerate(captum):
            theirs = result.token_attr[step].to(torch.float64)
            mine = ours[row][made.prompt_mask[row].bool()]
            per_step = _worse(per_step, float((mine - theirs).abs().max() / theirs.abs().max()))
    summed = explain_generation(double, batch, method="grad_x_input", continuation=made.tokens, steps="sum")
    sequence = 0.0
    for row, result in enumerate(captum):
        mine = summed.scores[row, 0, :prompt_width][made.prompt_mask[row].bool()]
        theirs = result.seq_attr.to(torch.float64)
        sequence = _worse(sequence, float((mine - theirs).abs().max() / theirs.abs().max()))
    return {"per_step": per_step, "sequence": sequence}


def per_step_rerun(model: nn.Module, batch: dict[str, torch.Tensor], made: Continuation, method: str) -> None:
    """One explanation per step of that step's context alone (one forward each), as per-token tools do."""
    for step in range(made.steps):
        explain_generation(model, batch, method=method, continuation=made.tokens[:, : step + 1], steps=[step])


def _peak_child(args: argparse.Namespace, what: str, prompt: int, new: int, batch: int) -> float:
    command = [
        sys.executable,
        "-m",
        "bench.generation",
        "--memory-child",
        what,
        str(prompt),
        str(new),
        str(batch),
        *args.passthrough,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def memory_child(args: argparse.Namespace, what: str, prompt: int, new: int, size: int) -> None:
    """Print the peak RSS (MiB) of one generation or one explanation above the loaded model and prompts.

    An explanation explains a random continuation (ids that are never pad/BOS/EOS, so every row has ``new`` tokens:
    the same shapes and cost as a generated one); generating it first would raise the peak that the delta is taken
    from and hide the explanation's own memory."""
    model = build_model(args.arch, args.layers, args.hidden, args.heads, args.vocabulary, args.positions)
    batch = prompts(size, prompt, args.vocabulary)
    continuation = prompts(size, new, args.vocabulary, seed=1)["input_ids"]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if what == "generate":
        generate_continuation(model, batch, new, {"eos_token_id": None})
    else:
        explain_generation(model, batch, method=what, continuation=continuation, **FAST_OPTIONS.get(what, {}))
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark and print a Markdown table (and ``--json`` rows)."""
    parser = argparse.ArgumentParser(prog="python -m bench.generation", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--arch", default="llama", choices=("llama", "qwen2", "mistral", "gpt2"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocabulary", type=int, default=2000)
    parser.add_argument("--positions", type=int, default=512)
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--captum", action="store_true", help="side by side with Captum (pip install captum)")
    parser.add_argument("--no-rerun", action="store_true", help="skip the per-step re-run of attention/rollout")
    parser.add_argument("--no-compare", action="store_true", help="with --captum: skip the float64 comparison")
    parser.add_argument("--memory", action="store_true", help="peak memory per method (child processes)")
    parser.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    model_flags = ["--arch", args.arch, "--layers", str(args.layers), "--hidden", str(args.hidden), "--heads",
                   str(args.heads), "--vocabulary", str(args.vocabulary), "--positions", str(args.positions),
                   "--threads", str(args.threads)]  # fmt: skip
    args.passthrough = model_flags
    if args.memory_child is not None:
        what, prompt, new, size = args.memory_child
        memory_child(args, what, int(prompt), int(new), int(size))
        return
    model = build_model(args.arch, args.layers, args.hidden, args.heads, args.vocabulary, args.positions)
    tokenizer = word_tokenizer(args.vocabulary) if args.captum else None
    load = os.getloadavg()
    print(f"# bench.generation {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"# load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; torch threads {torch.get_num_threads()}")
    rows: list[dict[str, Any]] = []
    compared = False
    for prompt in args.prompts:
        for new in args.new_tokens:
            for batch_size in args.batch_sizes:
                batch = prompts(batch_size, prompt, args.vocabulary)
                made = generate_continuation(model, batch, new, {"eos_token_id": None})

                def generate(batch: dict[str, torch.Tensor] = batch, new: int = new) -> object:
                    return generate_continuation(model, batch, new, {"eos_token_id": None})

                generation_seconds = statistics.median(timed(generate) for _ in range(args.repeats))
                runs: dict[str, Callable[[], object]] = {}
                for method in args.methods:

                    def run(method: str = method, made: Continuation = made, batch: dict = batch) -> object:
                        options = FAST_OPTIONS.get(method, {})
                        return explain_generation(model, batch, method=method, continuation=made.tokens, **options)

                    runs[method] = run
                if "grad_x_input" in args.methods:

                    def summed(made: Continuation = made, batch: dict = batch) -> object:
                        return explain_generation(
                            model, batch, method="grad_x_input", continuation=made.tokens, steps="sum"
                        )

                    runs["grad_x_input sum"] = summed
                if not args.no_rerun:
                    for method in ("attention", "rollout"):
                        if method in args.methods:

                            def rerun(method: str = method, made: Continuation = made, batch: dict = batch) -> None:
                                per_step_rerun(model, batch, made, method)

                            runs[f"{method} per step"] = rerun
                if args.captum:
                    if not compared and not args.no_compare:
                        differences = compare_with_captum(model, tokenizer, made)
                        print(
                            f"# Captum vs ours (float64, P={prompt}, T={new}, batch {batch_size}): per-step "
                            f"{differences['per_step']:.2e}, sequence {differences['sequence']:.2e} (relative to the "
                            "largest score)"
                        )
                        compared = True
                    attribution = captum_attribution(model, tokenizer)

                    def captum(made: Continuation = made, attribution: Any = attribution) -> object:
                        return captum_run(attribution, tokenizer, made)

                    runs["captum"] = captum
                ratios = paired_ratios(runs, generate, args.repeats)
                row: dict[str, Any] = {
                    "prompt": prompt, "new_tokens": new, "batch": batch_size, "generate_s": generation_seconds,
                    "ratios": ratios,
                }  # fmt: skip
                if args.memory:
                    row["memory_mib"] = {
                        what: _peak_child(args, what, prompt, new, batch_size) for what in ("generate", *args.methods)
                    }
                rows.append(row)
                log.info("P=%d T=%d batch %d: %s", prompt, new, batch_size, json.dumps(ratios))
    print(markdown(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"command": sys.argv, "load": load, "rows": rows}, handle, indent=1)


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The table: generation seconds, each run's time as a multiple of generation, and the derived speed-ups."""
    names = list(rows[0]["ratios"]) if rows else []
    header = ["P", "T", "batch", "generate s", *names]
    derived = []
    if any("captum" in row["ratios"] for row in rows):
        derived += [f"captum / {name}" for name in ("grad_x_input", "attnlrp") if name in names]
    derived += [f"{name} per step / {name}" for name in ("attention", "rollout") if f"{name} per step" in names]
    lines = ["| " + " | ".join(header + derived) + " |", "|" + "---|" * (len(header) + len(derived))]
    for row in rows:
        ratios = row["ratios"]
        cells = [str(row["prompt"]), str(row["new_tokens"]), str(row["batch"]), f"{row['generate_s']:.3f}"]
        cells += [f"{ratios[name]:.2f}" for name in names]
        for name in derived:
            numerator, denominator = name.split(" / ")
            cells.append(f"{ratios[numerator] / ratios[denominator]:.1f}")
        lines.append("| " + " | ".join(cells) + " |")
        if "memory_mib" in row:
            memory = ", ".join(f"{what} {mib:.0f}" for what, mib in row["memory_mib"].items())
            lines.append(f"| | | | peak MiB: {memory} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
