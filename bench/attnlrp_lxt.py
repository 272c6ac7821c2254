"""Conformance of ``attnlrp`` / ``cp_lrp`` with the authors' own code (``lxt``), outside the test suite.

The oracle is deliberately not part of this repository (nothing of the authors' code goes into the project): lxt
(github.com/rachtibat/LRP-eXplains-Transformers) at commit f04344177551bfcc3665e88afe96501f43fe560b, in virtualenvs
of its own with the transformers versions it supports (5.9.0 for the decoders, 4.52.4 for BERT), with a small
``oracle.py`` that explains one case with lxt's AttnLRP/CP-LRP patch map and a ``make_inputs.py`` that writes tiny
float64 BERT, Llama, Qwen2 and GPT-2 classifiers (plain safetensors state dicts, a padded batch of two rows);
``--oracle-dir`` names the folder it was built in (the project's build machines have a script for it). For each
architecture and variant this script runs the oracle on a case, loads the same weights into this project's
transformers, explains the same padded batch with :func:`explainers.explain` and prints the worst per-token
difference relative to the largest oracle score of the row, and that padding is exactly 0.

    .venv/bin/python /tmp/lxt-oracle/make_inputs.py --arch all --out-dir /tmp/lxt-oracle/cases
    .venv/bin/python -m bench.attnlrp_lxt --oracle-dir /tmp/lxt-oracle

lxt's BERT patch has no CP-LRP map, so ``cp_lrp`` is compared on the three decoders only.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_file

from explainers import explain

log = logging.getLogger("bench.attnlrp_lxt")

CLASSES = {"bert": "Bert", "llama": "Llama", "qwen2": "Qwen2", "gpt2": "GPT2"}
VARIANTS = {"attnlrp": "attnlrp", "cp_lrp": "cplrp"}  # our method -> the oracle's --variant


def load_case(case: Path) -> tuple[Any, dict[str, torch.Tensor]]:
    """The case's classifier (float64, eager attention) and its padded batch."""
    config_dict = json.loads((case / "config.json").read_text())
    arch = config_dict.pop("_arch", case.name)
    config = getattr(transformers, CLASSES[arch] + "Config").from_dict(config_dict)
    model = getattr(transformers, CLASSES[arch] + "ForSequenceClassification")(config).double()
    missing, _ = model.load_state_dict(load_file(str(case / "weights.safetensors")), strict=False)
    if missing:
        raise RuntimeError(f"{case}: weights missing for {missing}")
    model.set_attn_implementation("eager")
    ids = torch.tensor(json.loads((case / "input_ids.json").read_text()))
    mask = torch.tensor(json.loads((case / "attention_mask.json").read_text()))
    inputs = {"input_ids": ids, "attention_mask": mask}
    if arch == "bert":
        inputs["token_type_ids"] = torch.zeros_like(ids)
    return model.eval(), inputs


def run_oracle(oracle_dir: Path, case: Path, variant: str, target: int, out: Path) -> dict[str, Any]:
    """Run lxt's oracle on ``case``; returns its JSON output."""
    command = [
        str(oracle_dir / "venv" / "bin" / "python"), str(oracle_dir / "oracle.py"), "--arch", case.name,
        "--weights", str(case / "weights.safetensors"), "--config", str(case / "config.json"),
        "--input-ids", str(case / "input_ids.json"), "--attention-mask", str(case / "attention_mask.json"),
        "--target", str(target), "--variant", variant, "--out", str(out), "--quiet",
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True)
    return dict(json.loads(out.read_text()))


def compare(oracle_dir: Path, arch: str, method: str, target: int, work: Path) -> dict[str, Any]:
    """Worst |ours − lxt| / max|lxt| over the rows of the case, padding check, versions."""
    case = oracle_dir / "cases" / arch
    reference = run_oracle(oracle_dir, case, VARIANTS[method], target, work / f"{arch}_{method}.json")
    model, inputs = load_case(case)
    ours = explain(model, inputs, method=method, target=target)
    theirs = torch.tensor(reference["relevance"], dtype=torch.float64)
    worst, padding_zero = 0.0, True
    for row in range(theirs.shape[0]):
        real = inputs["attention_mask"][row].bool()
        difference = (ours.scores[row][real] - theirs[row][real]).abs().max() / theirs[row][real].abs().max()
        worst = max(worst, float(difference))
        padding_zero = padding_zero and bool((ours.scores[row][~real] == 0).all())
    logits = float((ours.logits - torch.tensor(reference["logits"], dtype=torch.float64)).abs().max())
    meta = reference["meta"]
    return {
        "arch": arch, "method": method, "worst": worst, "padding_zero": padding_zero, "logits": logits,
        "lxt": meta["lxt_source"], "lxt_transformers": meta["transformers"], "ours": transformers.__version__,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Compare every architecture and variant; print one table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oracle-dir", type=Path, default=Path("/tmp/lxt-oracle"))
    parser.add_argument("--archs", nargs="+", default=list(CLASSES))
    parser.add_argument("--target", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for arch in args.archs:
            for method in VARIANTS:
                if arch == "bert" and method == "cp_lrp":
                    continue  # lxt ships no CP-LRP map for BERT
                rows.append(compare(args.oracle_dir, arch, method, args.target, Path(work)))
    print("| arch | method | worst per-token difference / max score | padding exactly 0 | logits diff | lxt | "
          "lxt's transformers | ours |")  # fmt: skip
    print("|---|---|---:|---|---:|---|---|---|")
    for row in rows:
        print(
            f"| {row['arch']} | {row['method']} | {row['worst']:.1e} | {row['padding_zero']} | {row['logits']:.0e} | "
            f"{row['lxt']} | {row['lxt_transformers']} | {row['ours']} |"
        )


if __name__ == "__main__":
    main()
