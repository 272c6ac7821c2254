"""The outputs of ``explain-eval --all``: each model's table, the rank overview and Chefer et al.'s ordering
(Markdown), the JSON document of a run, its provenance (date, command, :func:`explain_eval.provenance.machine`), and
the merge of several runs' documents into one table (``--merge``).
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .ranking import METRICS, MethodResult, Subject
from .results import RANDOM, mean_and_stderr


def _cell(summary: Mapping[str, Any], metric: str, scale: float = 100.0, digits: int = 1) -> str:
    value = summary[metric]
    mean, stderr = value["mean"] * scale, value["stderr"] * scale
    if math.isnan(stderr):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {stderr:.{digits}f}"


def _seconds(value: float) -> str:
    return f"{value:.4f}" if value < 0.01 else f"{value:.3f}" if value < 1 else f"{value:.2f}"


def ranked(document: Mapping[str, Any]) -> list[str]:
    """The applicable methods of one model's results, by mean ABPC, highest first (ties: by name)."""
    applicable = [name for name, summary in document["methods"].items() if "not_applicable" not in summary]
    return sorted(applicable, key=lambda name: (-document["methods"][name]["abpc"]["mean"], name))


def model_table(document: Mapping[str, Any]) -> str:
    """One model's table (probabilities in percent; methods ranked by ABPC; ``n/a`` rows last)."""
    header = (
        f"### {document['model']}\n\n{document['task']}, `{document['model_type']}`; target: {document['target']}; "
        f"removal: {document['removal']}; n = {document['n']} examples per seed, drawn from {document['pool']} "
        "held-out ones, "
        f"seeds {', '.join(str(seed) for seed in document['seeds'])}; mean target probability "
        f"{100 * document['mean_full_probability']:.1f}%.\n"
    )
    columns = [title for title, _ in METRICS.values()]
    lines = [
        header,
        "| rank | method | " + " | ".join(columns) + " | seconds / example |",
        "|---:|---|" + "---:|" * (len(columns) + 1),
    ]
    for rank, name in enumerate(ranked(document), start=1):
        summary = document["methods"][name]
        cells = [_cell(summary, metric) for metric in METRICS]
        cost = "-" if name == RANDOM else _seconds(summary["seconds_per_example"]["mean"])
        lines.append(f"| {rank} | {name} | " + " | ".join(cells) + f" | {cost} |")
    for name, summary in document["methods"].items():
        if "not_applicable" in summary:
            reason = summary["not_applicable"].replace("|", "/")
            lines.append(f"| - | {name} | n/a ({reason}) |" + " |" * len(columns))
    return "\n".join(lines)


def rank_table(documents: Sequence[Mapping[str, Any]], methods: Sequence[str]) -> str:
    """Every method's ABPC rank on each model (``n/a`` where it does not apply), the methods in registry order."""
    ranks = {
        document["model"]: {name: index + 1 for index, name in enumerate(ranked(document))} for document in documents
    }
    lines = [
        "| method | " + " | ".join(document["model"] for document in documents) + " |",
        "|---|" + "---:|" * len(documents),
    ]
    for name in methods:
        cells = [
            str(ranks[document["model"]][name]) if name in ranks[document["model"]] else "n/a" for document in documents
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: The ordering Chefer et al. (CVPR 2021) report on ViT and BERT: their relevance above these baselines.
CHEFER_BASELINES = ("rollout", "gradcam", "partial_lrp", "attention")


def comparison(first: Mapping[str, Any], second: Mapping[str, Any], metric: str) -> str:
    """Whether ``first`` beats ``second`` on ``metric`` (by :data:`METRICS`' direction): ``holds`` or ``reversed``
    when the means differ by more than twice the combined standard error over seeds (and by more than 0.05 points),
    else ``tie``."""
    higher = METRICS[metric][1]
    a, b = first[metric], second[metric]
    difference = (a["mean"] - b["mean"]) if higher else (b["mean"] - a["mean"])
    error = math.sqrt(a["stderr"] ** 2 + b["stderr"] ** 2)
    if math.isnan(error) or abs(difference) <= max(2 * error, 5e-4):
        return f"tie ({100 * difference:+.1f})"
    return f"{'holds' if difference > 0 else 'reversed'} ({100 * difference:+.1f})"


def chefer_table(documents: Sequence[Mapping[str, Any]]) -> str:
    """Chefer et al.'s ordering (relevance above :data:`CHEFER_BASELINES`) held against each model where both apply:
    per metric, ``holds``, ``reversed`` or ``tie`` and relevance's advantage in points."""
    lines = [
        "| model | relevance vs | ABPC | positive AUC | negative AUC | comprehensiveness | sufficiency |",
        "|---|---|---|---|---|---|---|",
    ]
    for document in documents:
        methods = document["methods"]
        if "not_applicable" in methods.get("relevance", {"not_applicable": ""}):
            continue
        for baseline in CHEFER_BASELINES:
            if "not_applicable" in methods.get(baseline, {"not_applicable": ""}):
                continue
            cells = [comparison(methods["relevance"], methods[baseline], metric) for metric in METRICS]
            lines.append(f"| {document['model']} | {baseline} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


NOTE = """\
Every registered method on every default model, ranked by the area between the perturbation curves (ABPC), with
Chefer et al.'s perturbation AUCs, ERASER's comprehensiveness and sufficiency, and each method's cost, all measured in
one run of the command below (explain_eval/ranking.py). All scores are in percent of the target's probability
(`p`): **positive AUC** = mean level of `p` while 0-90% of the candidates are removed most relevant first (lower is
better), **negative AUC** = the same, least relevant first (higher is better), **ABPC** = negative AUC minus
positive AUC (higher is better; a random ranking scores about 0), **comprehensiveness** = `p` lost when the top
k% are removed, **sufficiency** = `p` lost when only the top k% are kept (lower is better), both averaged over
k in 1, 5, 10, 20, 50% (the top k% of n candidates is ceil(k·n) of them). Each cell is the mean over seeds of the
per-seed mean over the drawn examples, ± its standard error over seeds; a seed draws the examples, the `random`
ranking and the methods' own seed (SmoothGrad's noise). Methods run with their default options unless the command
sets some (`--option`). **seconds / example** is the explanation's wall time per
example in the same run (batched; the perturbation forwards are not included), on the machine named below, with
other work sharing its cores: compare methods within one model, not across runs."""


def write_outputs(out: Path, header: Mapping[str, Any], documents: Sequence[Mapping[str, Any]]) -> None:
    """``<out>.json`` (everything) and ``<out>.md`` (the note, the rank overview and one table per model)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {**header, "models": list(documents)}
    out.with_suffix(".json").write_text(json.dumps(payload, indent=1), encoding="utf-8")
    parts = [
        "# Faithfulness of every method on every default model\n",
        NOTE,
        "",
        provenance(header),
        "",
        "## Ranks by ABPC\n",
        rank_table(documents, header["methods"]),
        "",
        "## Chefer et al.'s ordering\n",
        "Chefer et al. report their relevance above rollout, GradCAM, partial LRP and raw attention on ViT and BERT. "
        "Per model where relevance applies: `holds` when relevance is better by more than twice the combined standard "
        "error over seeds, `reversed` when worse by as much, else `tie`; in brackets relevance's advantage in points "
        "(positive = better).\n",
        chefer_table(documents),
        "",
        "## Per model\n",
        "\n\n".join(model_table(document) for document in documents),
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(parts), encoding="utf-8")


def provenance(header: Mapping[str, Any]) -> str:
    """The date, command, machine and wall time of a run, or of each run a merged table is made of."""
    lines = [f"- date: {header['date']}", f"- command: `{header['command']}`"]
    for run in header.get("runs", []):
        lines.append(
            f"- run of {', '.join(run['models'])}: `{run['command']}` ({run['date']}, {run.get('seconds', 0):.0f} s)"
        )
    lines.append(f"- machine: {header['machine']}")
    if "runs" not in header:
        lines.append(f"- wall time: {header.get('seconds', 0):.0f} s")
    return "\n".join(lines)


def merge(paths: Sequence[Path], out: Path, command: str) -> None:
    """One table from the ``.json`` outputs of several ``--all`` runs (e.g. models run side by side), each model
    from one run; the runs' commands, dates and machines are kept.

    Raises:
        ValueError: for a model found in two files, or runs with different methods or machines.
    """
    runs = [json.loads(Path(path).read_text(encoding="utf-8")) for path in paths]
    documents: list[dict[str, Any]] = []
    for run in runs:
        if any(run.get(key) != runs[0].get(key) for key in ("methods", "machine", "options")):
            raise ValueError(f"{paths[0]} and another file differ in methods, options or machine; merge like runs")
        for document in run["models"]:
            if any(document["model"] == seen["model"] for seen in documents):
                raise ValueError(f"model {document['model']!r} is in more than one file")
            documents.append(document)
    header = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "machine": runs[0]["machine"],
        "methods": runs[0]["methods"],
        "fractions": runs[0]["fractions"],
        "eraser_bins": runs[0]["eraser_bins"],
        "options": runs[0].get("options", {}),
        "runs": [
            {key: run.get(key) for key in ("command", "date", "seconds")}
            | {"models": [document["model"] for document in run["models"]]}
            for run in runs
        ],
    }
    write_outputs(out, header, documents)


def subject_document(
    subject: Subject, results: Mapping[str, MethodResult], n: int, seeds: Sequence[int], full_means: Sequence[float]
) -> dict[str, Any]:
    """One model's JSON document (``full_means``: each seed's mean unperturbed target probability)."""
    return {
        "model": subject.name,
        "task": subject.task,
        "model_type": subject.model_type,
        "target": subject.target,
        "removal": subject.removal,
        "n": min(n, subject.pool_size()),
        "pool": subject.pool_size(),
        "seeds": list(seeds),
        "mean_full_probability": mean_and_stderr(full_means)[0],
        "methods": {method: result.summary() for method, result in results.items()},
    }
