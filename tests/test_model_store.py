"""Tests of model_store: data loading and splits, model-config.yaml, and the tiny-model build path.

None of these trains a default model: the build tests run the same recipe code on tiny random-init models.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from transformers import (
    AutoImageProcessor,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from model_store import REPO_ROOT
from model_store import build as build_module
from model_store.archive import MANIFEST_PATH, MODEL_CONFIG_FILE, ServingConfig
from model_store.common import seed_everything
from model_store.data import (
    DIGIT_LABELS,
    SENTIMENT_LABELS,
    TextExample,
    deduplicate,
    load_digit_images,
    load_tweets,
    normalise_text,
    split_tweets,
    stratified_split_indices,
    stratified_subsample,
)
from model_store.recipes import TextRecipe, VisionRecipe
from model_store.train_text import _build_model, length_bucketed_batches
from model_store.train_vision import make_image_processor, preprocess, random_shift

# --------------------------------------------------------------------------------------------------------------------
# Data


def _write_csv(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    lines = ["sentiment,confidence,text"] + [",".join(row) for row in rows]
    path.write_bytes(("\r\n".join(lines) + "\r\n").encode("latin-1"))
    return path


@pytest.fixture(scope="module")
def corpus() -> list[TextExample]:
    return load_tweets()


def test_real_corpus_matches_its_documentation(corpus: list[TextExample]) -> None:
    # shared/DATA.md: 38,158 rows; negative 16,186, neutral 15,018, positive 6,954; some empty confidences.
    assert len(corpus) == 38_158
    counts = Counter(SENTIMENT_LABELS[e.label] for e in corpus)
    assert counts == {"negative": 16_186, "neutral": 15_018, "positive": 6_954}
    empty = [e for e in corpus if e.confidence is None]
    assert len(empty) == 5_460, "rows with an empty confidence must be kept, with confidence None"
    assert all(0.0 <= e.confidence <= 1.0 for e in corpus if e.confidence is not None)


def test_latin1_bytes_are_decoded_and_empty_confidence_is_none(tmp_path: Path) -> None:
    path = _write_csv(
        tmp_path / "t.csv",
        [
            ("positive", "0.9", "caf\xe9 cr\xe8me \xf1"),  # é è ñ as single Latin-1 bytes
            ("negative", "", '"delayed, again \x8a"'),  # quoted comma, a C1 byte, empty confidence
            ("neutral", " 0.5 ", "  padded  "),
        ],
    )
    raw = path.read_bytes()
    with pytest.raises(UnicodeDecodeError):
        raw.decode("utf-8")  # the file is not UTF-8: a UTF-8 reader would fail
    examples = load_tweets(path)
    assert [e.text for e in examples] == ["café crème ñ", "delayed, again \x8a", "padded"]
    assert [e.label for e in examples] == [2, 0, 1]
    assert [e.confidence for e in examples] == [0.9, None, 0.5]


def test_real_corpus_has_non_ascii_text_decoded(corpus: list[TextExample]) -> None:
    assert any("é" in e.text or "Õ" in e.text for e in corpus)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([("angry", "0.5", "x")], "unknown sentiment 'angry'"),
        ([("positive", "high", "x")], "confidence 'high' is not a number"),
    ],
)
def test_bad_rows_name_the_line(tmp_path: Path, rows: list[tuple[str, str, str]], message: str) -> None:
    path = _write_csv(tmp_path / "bad.csv", [("neutral", "1", "fine"), *rows])
    with pytest.raises(ValueError, match=f":3: .*{message}"):
        load_tweets(path)


def test_wrong_header_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text("label,text\npositive,x\n", encoding="latin-1")
    with pytest.raises(ValueError, match="expected the header"):
        load_tweets(path)


def test_deduplicate_takes_majority_label_and_drops_ties() -> None:
    rows = [
        TextExample("Thanks @united", 2, 0.9),
        TextExample("thanks   @UNITED", 2, None),
        TextExample("thanks @united", 1, 0.4),
        TextExample("tie", 0, 1.0),
        TextExample("TIE", 1, 1.0),
        TextExample("alone", 1, None),
    ]
    unique, stats = deduplicate(rows)
    assert unique == [TextExample("Thanks @united", 2, 0.9), TextExample("alone", 1, None)]
    assert stats.rows_in == 6 and stats.rows_out == 2
    assert stats.duplicate_rows_removed == 2 and stats.conflicting_texts_relabelled == 1
    assert stats.tied_texts_dropped == 1 and stats.tied_rows_dropped == 2


def test_split_has_no_overlap_and_is_stratified(corpus: list[TextExample]) -> None:
    splits = split_tweets(corpus, test_fraction=0.15, val_fraction=0.05, seed=13)
    keys = {name: {normalise_text(e.text) for e in part} for name, part in vars(splits).items() if name != "dedup"}
    assert keys["train"].isdisjoint(keys["test"]) and keys["train"].isdisjoint(keys["val"])
    assert keys["val"].isdisjoint(keys["test"])
    total = len(splits.train) + len(splits.val) + len(splits.test)
    assert total == splits.dedup.rows_out
    assert len(splits.test) / total >= 0.15 - 1e-3 and len(splits.test) / total >= 0.10
    everything = Counter(e.label for part in (splits.train, splits.val, splits.test) for e in part)
    for part in (splits.train, splits.val, splits.test):
        counts = Counter(e.label for e in part)
        for label in range(3):
            assert counts[label] / len(part) == pytest.approx(everything[label] / total, abs=0.005)


def test_split_is_deterministic_and_depends_on_the_seed(corpus: list[TextExample]) -> None:
    first = split_tweets(corpus[:3000], 0.2, 0.0, seed=1)
    again = split_tweets(corpus[:3000], 0.2, 0.0, seed=1)
    other = split_tweets(corpus[:3000], 0.2, 0.0, seed=2)
    assert first.test == again.test and first.train == again.train
    assert first.test != other.test
    assert first.val == []


def test_stratified_subsample_keeps_proportions(corpus: list[TextExample]) -> None:
    sample = stratified_subsample(corpus, 3000, seed=0)
    assert len(sample) == 3000 and len({id(e) for e in sample}) == 3000  # no row drawn twice
    full, part = Counter(e.label for e in corpus), Counter(e.label for e in sample)
    for label in range(3):
        assert part[label] / 3000 == pytest.approx(full[label] / len(corpus), abs=0.002)
    assert stratified_subsample(corpus[:10], None, 0) == corpus[:10]


def test_digit_split_is_a_stratified_partition() -> None:
    images, labels = load_digit_images()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8 and images.max() == 255
    train, test = stratified_split_indices(labels, 0.2, seed=13)
    assert np.intersect1d(train, test).size == 0
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(len(labels)))
    assert len(test) / len(labels) >= 0.2
    test_share = np.bincount(labels[test], minlength=10) / len(test)
    all_share = np.bincount(labels, minlength=10) / len(labels)
    assert np.abs(test_share - all_share).max() < 0.01


def test_length_bucketed_batches_cover_every_item_once() -> None:
    lengths = np.random.default_rng(0).integers(1, 60, size=1001)
    batches = length_bucketed_batches(lengths, 32, np.random.default_rng(1), bucket_batches=4)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(1001))
    assert max(len(b) for b in batches) == 32
    # within a batch, lengths are close (sorted chunks): much less spread than random batches
    spread = np.mean([np.ptp(lengths[b]) for b in batches if len(b) == 32])
    assert spread < 20


def test_random_shift_moves_content_and_fills_background() -> None:
    pixels = torch.full((4, 3, 8, 8), -1.0)
    pixels[:, :, 3:5, 3:5] = 1.0
    shifted = random_shift(pixels, 2, -1.0, torch.Generator().manual_seed(0))
    assert shifted.shape == pixels.shape
    assert torch.equal((shifted == 1.0).sum(dim=(1, 2, 3)), torch.full((4,), 12))  # the blob stays whole
    assert torch.equal(random_shift(pixels, 0, -1.0, torch.Generator()), pixels)


# --------------------------------------------------------------------------------------------------------------------
# model-config.yaml


def test_text_model_config_has_the_agreed_keys() -> None:
    document = yaml.safe_load(ServingConfig(task="text", labels=SENTIMENT_LABELS, max_length=128).to_yaml())
    assert list(document) == ["minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout", "handler"]
    assert document["handler"] == {
        "task": "text",
        "model_dir": "model",
        "default_method": "attnlrp",
        "max_length": 128,
        "labels": ["negative", "neutral", "positive"],
        "device": "auto",
        "autocast_bf16": False,
    }


def test_image_model_config_has_image_keys_and_no_max_length() -> None:
    config = ServingConfig(task="image", labels=DIGIT_LABELS, image_size=(32, 32), max_image_bytes=2_000_000)
    handler = yaml.safe_load(config.to_yaml())["handler"]
    assert handler["task"] == "image" and "max_length" not in handler
    assert handler["labels"] == [str(d) for d in range(10)]
    assert handler["image_size"] == [32, 32] and handler["max_image_bytes"] == 2_000_000


def test_serving_config_rejects_mismatched_task_keys() -> None:
    with pytest.raises(ValueError, match="max_length"):
        ServingConfig(task="text", labels=("a",))
    with pytest.raises(ValueError, match="image_size"):
        ServingConfig(task="image", labels=("a",), max_length=3)


# --------------------------------------------------------------------------------------------------------------------
# Tiny build path


@pytest.fixture(scope="module")
def handlers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("handlers")
    paths = {"text": folder / "text_handler.py", "image": folder / "image_handler.py"}
    for path in paths.values():
        path.write_text("def handle(data, context):\n    return [None for _ in data]\n", encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory, handlers: dict[str, Path]) -> Path:
    out = tmp_path_factory.mktemp("build")
    threads = torch.get_num_threads()
    archives = build_module.build_tiny_archives(out, text_handler=handlers["text"], image_handler=handlers["image"])
    assert torch.get_num_threads() == threads, "the tiny build must restore torch's thread count"
    assert archives == {"sentiment": out / "sentiment" / "archive", "digits": out / "digits" / "archive"}
    return out


@pytest.mark.parametrize(
    ("name", "handler_file", "task"),
    [("sentiment", "text_handler.py", "text"), ("digits", "image_handler.py", "image")],
)
def test_tiny_archive_layout(tiny_build: Path, name: str, handler_file: str, task: str) -> None:
    archive = tiny_build / name / "archive"
    manifest = json.loads((archive / MANIFEST_PATH).read_text())
    assert manifest["model"]["modelName"] == name
    assert manifest["model"]["handler"] == handler_file
    assert manifest["model"]["configFile"] == MODEL_CONFIG_FILE
    assert (archive / handler_file).is_file()
    config = yaml.safe_load((archive / MODEL_CONFIG_FILE).read_text())
    assert config["batchSize"] == 8 and config["handler"]["task"] == task
    assert (archive / config["handler"]["model_dir"] / "config.json").is_file()
    metrics = json.loads((archive / "metrics.json").read_text())
    assert metrics == json.loads((tiny_build / name / "metrics.json").read_text())
    for key in ("held_out", "split_sizes", "seed", "build_seconds", "fingerprint"):
        assert key in metrics
    assert set(metrics["held_out"]["per_class"]) == set(config["handler"]["labels"])
    assert {"precision", "recall"} <= set(metrics["held_out"]["per_class"][config["handler"]["labels"][0]])
    for model_dir in (tiny_build / name / "model", archive / "model"):
        names = {p.name for p in model_dir.iterdir()}
        assert "model.safetensors" in names
        assert not names & {"pytorch_model.bin", "model.bin", "training_args.bin"}
        assert all(p.stat().st_mode & 0o444 == 0o444 for p in model_dir.iterdir()), "files must be world-readable"


def test_tiny_text_checkpoint_loads_offline_and_predicts(tiny_build: Path) -> None:
    model_dir = tiny_build / "sentiment" / "archive" / "model"
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.id2label == dict(enumerate(SENTIMENT_LABELS))
    assert model.config.label2id == {name: i for i, name in enumerate(SENTIMENT_LABELS)}
    batch = tokenizer(["the flight was delayed", "love it"], padding=True, return_tensors="pt")
    with torch.inference_mode():
        out = model(**batch, output_attentions=True)
    assert out.logits.shape == (2, 3)
    assert out.attentions is not None and len(out.attentions) == model.config.num_hidden_layers


def test_tiny_text_training_moves_only_the_unfrozen_layers(tiny_build: Path) -> None:
    recipe = TextRecipe.tiny()
    assert recipe.freeze_layers == 1
    trained = AutoModelForSequenceClassification.from_pretrained(tiny_build / "sentiment" / "model").state_dict()
    seed_everything(recipe.seed)  # the recipe seeds right before building the model: same initial weights
    initial = _build_model(recipe, vocab_size=trained["bert.embeddings.word_embeddings.weight"].shape[0], pad_id=0)
    for name, value in initial.state_dict().items():
        frozen = name.startswith(("bert.embeddings.", "bert.encoder.layer.0."))
        same = torch.equal(value, trained[name])
        assert same == frozen or name.endswith("position_ids"), name


def test_tiny_image_checkpoint_and_processor_reproduce_training_preprocessing(tiny_build: Path) -> None:
    model_dir = tiny_build / "digits" / "archive" / "model"
    model = AutoModelForImageClassification.from_pretrained(model_dir, attn_implementation="eager").eval()
    processor = AutoImageProcessor.from_pretrained(model_dir)
    assert model.config.id2label == dict(enumerate(DIGIT_LABELS))
    images, _ = load_digit_images()
    buffer = io.BytesIO()
    Image.fromarray(images[0], mode="L").save(buffer, format="PNG")
    png = Image.open(io.BytesIO(buffer.getvalue()))
    served = processor(images=png, return_tensors="pt")["pixel_values"]
    trained = preprocess(make_image_processor(VisionRecipe.tiny()), images[:1])
    assert torch.allclose(served, trained)
    photo = Image.new("RGBA", (300, 200), (0, 0, 0, 255))  # any PNG mode and size ends up (3, 32, 32)
    pixels = processor(images=[png, photo], return_tensors="pt")["pixel_values"]
    assert pixels.shape == (2, 3, 32, 32)
    with torch.inference_mode():
        assert model(pixel_values=pixels).logits.shape == (2, 10)


@pytest.fixture
def own_build(tiny_build: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny build, for tests that change it."""
    return Path(shutil.copytree(tiny_build, tmp_path / "build", symlinks=True))


def test_tiny_build_is_reused_then_rebuilt_when_inputs_change(own_build: Path, handlers: dict[str, Path]) -> None:
    tiny_build = own_build
    specs = build_module.model_specs(tiny=True, text_handler=handlers["text"], image_handler=handlers["image"])
    digits = specs["digits"]
    weights = tiny_build / "digits" / "model" / "model.safetensors"
    before = weights.stat().st_mtime_ns

    started = time.perf_counter()
    again = build_module.build_model(digits, tiny_build, progress=False, threads=1)
    assert not again.trained and not again.archived
    assert time.perf_counter() - started < 5
    assert weights.stat().st_mtime_ns == before

    new_handler = handlers["image"].with_name("image_handler_v2.py")
    new_handler.write_text("def handle(data, context):\n    return list(data)\n", encoding="utf-8")
    repackaged = build_module.build_model(replace(digits, handler=new_handler), tiny_build, progress=False, threads=1)
    assert repackaged.archived and not repackaged.trained, "a new handler repackages without retraining"
    assert (repackaged.archive_dir / "image_handler_v2.py").is_file()

    changed = replace(digits, handler=new_handler, recipe=replace(digits.recipe, seed=14))
    assert build_module.model_fingerprint(specs["sentiment"]) == build_module.model_fingerprint(
        replace(specs["sentiment"], handler=new_handler)
    ), "the model fingerprint must not depend on the handler (only the archive's does)"
    retrained = build_module.build_model(changed, tiny_build, progress=False, threads=1)
    assert retrained.trained and retrained.archived
    sentiment = build_module.build_model(specs["sentiment"], tiny_build, progress=False, threads=1)
    assert not sentiment.trained, "another model's recipe change must not retrain this one"
    assert retrained.metrics["seed"] == 14
    assert json.loads((tiny_build / "digits" / "archive" / "metrics.json").read_text())["seed"] == 14


def test_cli_builds_one_tiny_model(
    tmp_path: Path, handlers: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    status = build_module.main(
        [
            "--tiny",
            "--only",
            "digits",
            "--out",
            str(tmp_path),
            "--image-handler",
            str(handlers["image"]),
            "-q",
            "--no-progress",
        ]
    )
    assert status == 0
    assert "digits" in capsys.readouterr().out
    assert (tmp_path / "digits" / "archive" / MANIFEST_PATH).is_file()
    assert not (tmp_path / "sentiment").exists()


def test_cli_reports_a_missing_handler(tmp_path: Path) -> None:
    status = build_module.main(
        [
            "--tiny",
            "--only",
            "digits",
            "--out",
            str(tmp_path),
            "--image-handler",
            str(tmp_path / "nope.py"),
            "-q",
            "--no-progress",
        ]
    )
    assert status == 1
    # the model is trained and kept, so that a later run only packages it
    assert (tmp_path / "digits" / "model" / "config.json").is_file()
    assert not (tmp_path / "digits" / "archive").exists()


def test_retraining_removes_the_stale_archive_even_if_packaging_fails(
    own_build: Path, handlers: dict[str, Path]
) -> None:
    tiny_build = own_build
    spec = build_module.model_specs(tiny=True, text_handler=handlers["text"])["sentiment"]
    archive = tiny_build / "sentiment" / "archive"
    assert (archive / MANIFEST_PATH).is_file()
    changed = replace(spec, recipe=replace(spec.recipe, seed=99), handler=tiny_build / "missing_handler.py")
    with pytest.raises(FileNotFoundError, match=r"missing_handler\.py"):
        build_module.build_model(changed, tiny_build, progress=False, threads=1)
    assert not archive.exists(), "an archive of the previous model must not survive a retrain"
    restored = build_module.build_model(replace(changed, handler=handlers["text"]), tiny_build, progress=False)
    assert not restored.trained and restored.archived, "the retrained model is kept; only packaging is redone"
    assert json.loads((archive / "metrics.json").read_text())["seed"] == 99


def test_up_to_date_check_does_not_import_torch(tiny_build: Path, handlers: dict[str, Path]) -> None:
    # The serve command runs the build when archives are missing; an up-to-date build must stay cheap (no torch,
    # transformers or scikit-learn import, which take seconds on a loaded machine).
    script = (
        "import sys; from model_store.build import main; "
        f"status = main(['--tiny', '--only', 'sentiment', '--out', {str(tiny_build)!r}, "
        f"'--text-handler', {str(handlers['text'])!r}, '-q', '--no-progress']); "
        "heavy = [m for m in ('torch', 'transformers', 'sklearn') if m in sys.modules]; "
        "print(status, heavy)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip().splitlines()[-1] == "0 []"
    assert "reused" in result.stdout
