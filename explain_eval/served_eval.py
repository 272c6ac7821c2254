"""The perturbation test through a *served* text model (``explain-eval --served``): the explanations and every
perturbed prediction come from the service over REST, so it runs against any served text model, without its
checkpoint.

It removes **whole words**, not pieces: a text can only be sent as characters, and no text re-tokenizes into a
continuation piece (``##ight``) after a mask token. The served explanation's pieces are merged into words with the
CLI's rule (:func:`explain_client.render.merge_pieces`: a word's score is the sum of its pieces' scores), the words
are ranked, and a removed word is sent as one mask token per piece (``fl ##ight`` → ``[MASK][MASK]``), so the
length and the positions of the other tokens are kept, exactly as the in-process ``[MASK]`` removal keeps them.
Words are re-joined with spaces, which WordPiece (BERT-style) tokenizers split on anyway; tests check that the
service's tokenizer gives back the same pieces. Image models and deletion are in-process only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from explain_client import ExplainClient, Prediction, ServiceError
from explain_client.render import Word, merge_pieces

from .evaluate import Dataset, ModelResult, accumulate, empty_sums, finish_curves
from .faithfulness import FRACTIONS, perturbation_outcome
from .results import RANDOM


def words_to_text(words: Sequence[Word], remove: Sequence[bool], mask_token: str = "[MASK]") -> str:
    """The text of ``words`` with each removed word replaced by one ``mask_token`` per piece.

    Args:
        words: merged words (:func:`explain_client.render.merge_pieces`).
        remove: one flag per word.
        mask_token: the served tokenizer's mask token text.
    """
    return " ".join(
        mask_token * len(word.pieces) if removed else word.text for word, removed in zip(words, remove, strict=True)
    )


def _ok(result: Prediction | ServiceError) -> Prediction:
    if isinstance(result, ServiceError):
        raise result
    if result.explanation is not None and result.explanation.tokens is None:
        raise ValueError("--served supports text models only")
    return result


def _words(prediction: Prediction) -> list[Word]:
    explanation = prediction.explanation
    if explanation is None or explanation.tokens is None:
        raise ValueError("the service returned no text explanation")
    return merge_pieces(explanation.tokens, explanation.scores, explanation.special_tokens)


def evaluate_served(
    client: ExplainClient,
    model: str,
    dataset: Dataset,
    label_names: Sequence[str],
    methods: Sequence[str],
    mask_token: str = "[MASK]",
    batch_size: int = 32,
    seed: int = 0,
    progress: bool = True,
) -> ModelResult:
    """Run the positive and negative word-removal tests of every method through the served text model.

    Args:
        client: a REST client (REST keeps the class order of the probabilities).
        model: the served model name.
        dataset: held-out texts with gold labels (indices into ``label_names``).
        label_names: the dataset's label names, in index order.
        methods: registry names; ``random`` = a seeded random ranking.
        mask_token: the served tokenizer's mask token text.
        batch_size: texts per step (each step's calls are concurrent; TorchServe batches them).
        seed: seed of the ``random`` ranking.
        progress: show a tqdm progress bar.

    Raises:
        ValueError: for an image dataset or model, or a non-REST client.
        ServiceError: when the service refuses a call.
    """
    if dataset.task != "text":
        raise ValueError("--served supports text models; run image models in-process")
    if client.transport != "rest":
        raise ValueError("--served needs the REST transport (its probabilities keep the class order)")
    generator = torch.Generator().manual_seed(seed)
    sums = empty_sums(methods)
    correct_unperturbed = 0
    real_methods = [method for method in methods if method != RANDOM] or ["attention"]
    bar = tqdm(total=len(dataset) * len(methods), desc=f"{model}: served perturbation", unit="ex", disable=not progress)
    for start in range(0, len(dataset), batch_size):
        texts = dataset.texts[start : start + batch_size]
        explained = {
            method: [_ok(result) for result in client.explain_many(model, texts, method=method)]
            for method in real_methods
        }
        first = explained[real_methods[0]]
        served_labels = list(first[0].probabilities)
        gold = dataset.labels[start : start + batch_size]
        labels = torch.tensor([served_labels.index(label_names[index]) for index in gold])
        predicted = torch.tensor([prediction.label_id for prediction in first])
        unperturbed = torch.tensor([[prediction.probabilities[name] for name in served_labels] for prediction in first])
        correct_unperturbed += int((predicted == labels).sum())
        words = [_words(prediction) for prediction in first]
        width = max(1, *(len(row) for row in words))
        candidates = torch.zeros(len(texts), width, dtype=torch.bool)
        for row, row_words in enumerate(words):
            candidates[row, : len(row_words)] = True

        def predict(
            remove: torch.Tensor, words: list[list[Word]] = words, labels_order: list[str] = served_labels
        ) -> torch.Tensor:
            count = len(words)
            perturbed = [
                words_to_text(words[row % count], remove[row, : len(words[row % count])].tolist(), mask_token)
                for row in range(remove.shape[0])
            ]
            results = [_ok(result) for result in client.explain_many(model, perturbed, method=None)]
            return torch.tensor([[result.probabilities[name] for name in labels_order] for result in results])

        for method in methods:
            if method == RANDOM:
                scores = torch.rand(len(texts), width, generator=generator)
            else:
                scores = torch.zeros(len(texts), width)
                for row, prediction in enumerate(explained[method]):
                    values = [word.score for word in _words(prediction)]
                    scores[row, : len(values)] = torch.tensor(values)
            for direction in ("positive", "negative"):
                outcome = perturbation_outcome(
                    scores, candidates, predict, predicted, labels, direction == "positive", FRACTIONS[1:]
                )
                accumulate(sums[method][direction], outcome, predicted, labels, unperturbed)
            bar.update(len(texts))
    bar.close()
    removal = f"whole words replaced by one {mask_token} per piece, sent to the served model (REST)"
    curves = finish_curves(sums, len(dataset))
    return ModelResult(model, "text", len(dataset), correct_unperturbed / len(dataset), removal, curves)
