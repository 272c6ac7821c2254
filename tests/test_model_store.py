"""Tests of model_store: data loading and splits, model-config.yaml, and the tiny-model build path.

None of these trains a default model: the build tests run the same recipe code on tiny random-init models.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

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
from model_store import package as package_module
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
from tests import checkpoints

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
    # docs/DATA.md: 38,158 rows; negative 16,186, neutral 15,018, positive 6,954; some empty confidences.
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
    paths = {
        "text": folder / "text_handler.py",
        "image": folder / "image_handler.py",
        "token_classification": folder / "token_handler.py",
    }
    for path in paths.values():
        path.write_text("def handle(data, context):\n    return [None for _ in data]\n", encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory, handlers: dict[str, Path]) -> Path:
    out = tmp_path_factory.mktemp("build")
    threads = torch.get_num_threads()
    archives = build_module.build_tiny_archives(
        out, handlers["text"], handlers["image"], handlers["token_classification"]
    )
    assert torch.get_num_threads() == threads, "the tiny build must restore torch's thread count"
    assert archives == {name: out / name / "archive" for name in ("sentiment", "digits", "entities")}
    return out


@pytest.mark.parametrize(
    ("name", "handler_file", "task"),
    [
        ("sentiment", "text_handler.py", "text"),
        ("digits", "image_handler.py", "image"),
        ("entities", "token_handler.py", "token_classification"),
    ],
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
    if task == "token_classification":  # entity-level scores per type (PER of B-PER/I-PER)
        types = {label[2:] for label in config["handler"]["labels"] if label != "O"}
        assert set(metrics["held_out"]["per_type"]) == types
        assert {"precision", "recall", "f1"} <= set(metrics["held_out"]["per_type"]["PER"])
    else:
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


# --------------------------------------------------------------------------------------------------------------------
# Your own checkpoint: python -m model_store.package


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny checkpoint folders as users' save_pretrained writes them (tests/checkpoints.py), built once."""
    folder = tmp_path_factory.mktemp("own")
    built = {name: build(folder / name) for name, build in checkpoints.BUILDERS.items() if name != "decoder"}
    built["generic"] = checkpoints.generic_labels(folder / "generic")
    return built


def _copy(source: Path, destination: Path, *, drop: tuple[str, ...] = ()) -> Path:
    shutil.copytree(source, destination)
    for pattern in drop:
        for path in destination.glob(pattern):
            path.unlink()
    return destination


def _check_refused(path: Path | str, name: str, out: Path, *needles: str) -> str:
    """Run the packaging CLI's ``main`` on ``path``; expect exit status 2, an ``error:`` message on stderr holding
    every needle, and nothing written under ``out``."""
    capture = io.StringIO()
    with contextlib.redirect_stderr(capture):
        status = package_module.main([str(path), f"--name={name}", "--out", str(out), "--quiet"])
    message = capture.getvalue()
    assert status == 2, message
    assert message.startswith("error: ")
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    assert not out.exists(), "nothing may be written for a refused checkpoint"
    return message


def test_the_command_line_exits_non_zero_with_one_message(own: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(own["pairs"], tmp_path / "ckpt", drop=("*.safetensors",))
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04N.")
    command = [sys.executable, "-m", "model_store.package", str(folder), "--name", "m", "--out", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=False, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: the weights are pickle files only (pytorch_model.bin)")
    assert not (tmp_path / "out").exists()


def test_package_writes_a_servable_archive_and_reuses_it(own: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "store"
    first = package_module.package(own["pairs"], "pairs", out, package_module.Settings(max_length=64, batch_size=4))
    assert not first.reused and first.archive == out / "pairs"
    manifest = json.loads((first.archive / MANIFEST_PATH).read_text())
    assert manifest["model"]["modelName"] == "pairs" and manifest["model"]["handler"] == "text_handler.py"
    config = yaml.safe_load((first.archive / MODEL_CONFIG_FILE).read_text())
    assert config["batchSize"] == 4 and config["handler"]["max_length"] == 64
    assert config["handler"]["labels"] == ["entailment", "neutral", "contradiction"]
    files = sorted(path.name for path in (first.archive / "model").iterdir())
    assert files == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert all(not path.is_symlink() for path in (first.archive / "model").iterdir()), "the archive stands alone"
    started = time.perf_counter()
    again = package_module.package(own["pairs"], "pairs", out, package_module.Settings(max_length=64, batch_size=4))
    assert again.reused and time.perf_counter() - started < 5
    changed = package_module.package(own["pairs"], "pairs", out, package_module.Settings(max_length=32))
    assert not changed.reused
    assert yaml.safe_load((out / "pairs" / MODEL_CONFIG_FILE).read_text())["handler"]["max_length"] == 32


@pytest.mark.parametrize(
    ("name", "task", "head_type", "extra"),
    [
        ("topics", "text", "multi_label", {"threshold": 0.5}),
        ("rating", "text", "regression", {}),
        ("animals", "image", "single_label", {"image_size": [16, 16]}),
    ],
)
def test_package_reads_task_head_and_labels_from_the_checkpoint(
    own: dict[str, Path], tmp_path: Path, name: str, task: str, head_type: str, extra: dict[str, Any]
) -> None:
    checkpoint = package_module.validate(own[name], name)
    assert checkpoint.task == task and checkpoint.head_type == head_type and not checkpoint.warnings
    result = package_module.package(own[name], name, tmp_path, checkpoint=checkpoint)
    handler = yaml.safe_load((result.archive / MODEL_CONFIG_FILE).read_text())["handler"]
    assert handler["task"] == task
    for key, value in extra.items():
        assert handler[key] == value


def test_multi_label_threshold_from_the_user_or_the_checkpoint(own: dict[str, Path], tmp_path: Path) -> None:
    assert package_module.validate(own["topics"], "t", package_module.Settings(threshold=0.3)).threshold == 0.3
    folder = _copy(own["topics"], tmp_path / "topics")
    document = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**document, "threshold": 0.7}))
    assert package_module.validate(folder, "t").threshold == 0.7


def test_generic_labels_are_served_with_a_warning(
    own: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING", logger="model_store.package"):
        result = package_module.package(own["generic"], "generic", tmp_path)
    assert result.checkpoint.labels == ("LABEL_0", "LABEL_1")
    assert any("generic" in record.message and "id2label" in record.message for record in caplog.records)


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "-rm", "", "x" * 65, "naïve", "a.b", "a b"])
def test_unsafe_names_are_refused(own: dict[str, Path], tmp_path: Path, name: str) -> None:
    _check_refused(own["pairs"], name, tmp_path / "out", "not a safe model name", "letters, digits")


def test_not_a_folder_is_refused(own: dict[str, Path], tmp_path: Path) -> None:
    _check_refused(tmp_path / "missing", "m", tmp_path / "out", "is not a folder", "save_pretrained")
    _check_refused(own["pairs"] / "config.json", "m", tmp_path / "out", "is not a folder")
    _check_refused("some-org/some-model", "m", tmp_path / "out", "model hub id is not accepted", "--local-dir")
    _check_refused("https://example.com/model", "m", tmp_path / "out", "is a URL", "no downloads")


def test_a_folder_without_config_json_is_refused(own: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(own["pairs"], tmp_path / "ckpt", drop=("config.json",))
    _check_refused(folder, "m", tmp_path / "out", "has no config.json", "save_pretrained")


def test_an_unsupported_architecture_is_refused_and_the_supported_ones_listed(tmp_path: Path) -> None:
    from explainers import supported_model_types

    folder = tmp_path / "xlnet"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "xlnet", "architectures": ["XLNetForSequenceClassification"]})
    )
    _check_refused(
        folder, "m", tmp_path / "out", "model type 'xlnet' is not supported", ", ".join(supported_model_types())
    )


def test_a_base_model_without_a_classification_head_is_refused(own: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(own["pairs"], tmp_path / "base")
    document = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**document, "architectures": ["BertModel"]}))
    _check_refused(folder, "m", tmp_path / "out", "the service serves classifiers", "ForSequenceClassification")
    headless = _copy(own["pairs"], tmp_path / "headless")
    from safetensors.torch import load_file, save_file

    weights = load_file(str(headless / "model.safetensors"))
    save_file(
        {key: value for key, value in weights.items() if not key.startswith("classifier.")},
        str(headless / "model.safetensors"),
    )
    _check_refused(headless, "m", tmp_path / "out", "no trained classification head", "classifier.weight")


def test_labels_that_do_not_match_the_head_are_refused(own: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(own["pairs"], tmp_path / "ckpt")
    document = json.loads((folder / "config.json").read_text())
    document["id2label"] = {"0": "yes", "1": "no"}
    document["label2id"] = {"yes": 0, "no": 1}
    (folder / "config.json").write_text(json.dumps(document))
    _check_refused(folder, "m", tmp_path / "out", "classifier.weight has shape [3, 32]", "num_labels")


def test_pickle_weights_are_refused_with_the_conversion_command(own: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(own["pairs"], tmp_path / "pickled", drop=("*.safetensors",))
    model = AutoModelForSequenceClassification.from_pretrained(str(own["pairs"]))
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    message = _check_refused(
        folder, "m", tmp_path / "out", "pytorch_model.bin", "pickle runs code", "trusted environment"
    )
    assert "AutoModelForSequenceClassification" in message and "save_pretrained" in message
    # the command the message gives converts them (run here, in the test's trusted environment)
    command = message.strip().split("\n")[-1].strip()
    assert command.startswith("python -c ")
    converted = subprocess.run(
        ["bash", "-c", command.replace("python", sys.executable, 1)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert converted.returncode == 0, converted.stderr
    result = package_module.package(folder, "converted", tmp_path / "store")
    assert "pytorch_model.bin" in result.checkpoint.left_out
    assert not list((result.archive / "model").glob("*.bin")), "pickle files never go into an archive"


def test_code_and_subfolders_are_left_out_of_the_archive(own: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(own["pairs"], tmp_path / "ckpt")
    (folder / "modeling_evil.py").write_text("raise SystemExit('ran')\n")
    (folder / "checkpoint-500").mkdir()
    (folder / "checkpoint-500" / "optimizer.pt").write_bytes(b"\x80\x04")
    result = package_module.package(folder, "m", tmp_path / "store")
    assert set(result.checkpoint.left_out) == {"modeling_evil.py", "checkpoint-500/"}
    assert sorted(path.name for path in (result.archive / "model").iterdir()) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    )


def test_damaged_safetensors_are_refused(own: dict[str, Path], tmp_path: Path) -> None:
    folder = _copy(own["pairs"], tmp_path / "ckpt")
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    _check_refused(
        folder, "m", tmp_path / "out", "model.safetensors is not a readable safetensors file", "save_pretrained"
    )


def test_a_missing_tokenizer_or_image_processor_is_refused(own: dict[str, Path], tmp_path: Path) -> None:
    text = _copy(own["pairs"], tmp_path / "text", drop=("tokenizer*", "vocab*", "special_tokens_map.json"))
    _check_refused(text, "m", tmp_path / "out", "no loadable tokenizer", "tokenizer.save_pretrained(folder)")
    image = _copy(own["animals"], tmp_path / "image", drop=("preprocessor_config.json",))
    _check_refused(
        image, "m", tmp_path / "out", "no loadable image processor", "image_processor.save_pretrained(folder)"
    )


def test_models_spec_and_yaml_file(tmp_path: Path) -> None:
    entries = package_module.parse_models("a=/x/a, b=rel/b")
    assert [(entry.name, str(entry.path)) for entry in entries] == [("a", "/x/a"), ("b", "rel/b")]
    with pytest.raises(package_module.PackageError, match="not name=path"):
        package_module.parse_models("just-a-path")
    with pytest.raises(package_module.PackageError, match="more than once"):
        package_module.parse_models("a=/x,a=/y")
    models = tmp_path / "models.yaml"
    models.write_text(
        "defaults: {device: cpu, batch_size: 4}\n"
        "models:\n  reviews: {path: ckpt/reviews, default_method: rollout}\n"
        "  topics: {path: /abs/topics, threshold: 0.4}\n"
    )
    read = {entry.name: entry for entry in package_module.read_models_file(models)}
    assert (
        read["reviews"].path == tmp_path / "ckpt" / "reviews" and read["reviews"].settings.default_method == "rollout"
    )
    assert read["topics"].settings.threshold == 0.4 and read["topics"].settings.batch_size == 4
    models.write_text("models:\n  a: {path: /x, max_lenght: 3}\n")
    with pytest.raises(package_module.PackageError, match="unknown setting"):
        package_module.read_models_file(models)


def test_a_decoder_classifier_pads_on_the_left_and_gets_a_supported_default_method(tmp_path: Path) -> None:
    folder = checkpoints.decoder(tmp_path / "decoder")
    checkpoint = package_module.validate(folder, "decoder")
    assert checkpoint.pad_token_id is None and not checkpoint.warnings
    assert checkpoint.default_method == "attnlrp", "the served default works on decoders (relevance does not)"
    with pytest.raises(package_module.PackageError, match="default_method 'relevance' does not work on llama"):
        package_module.validate(folder, "decoder", package_module.Settings(default_method="relevance"))


def test_a_decoder_without_a_pad_token_is_padded_with_eos_and_says_so(tmp_path: Path) -> None:
    folder = checkpoints.decoder(tmp_path / "decoder", pad=False)
    checkpoint = package_module.validate(folder, "decoder")
    assert checkpoint.pad_token_id == 2
    assert len(checkpoint.warnings) == 1 and "padded with the EOS token '</s>' (id 2)" in checkpoint.warnings[0]
    result = package_module.package(folder, "decoder", tmp_path / "store", checkpoint=checkpoint)
    assert yaml.safe_load((result.archive / MODEL_CONFIG_FILE).read_text())["handler"]["pad_token_id"] == 2


def test_a_decoder_that_cannot_be_padded_is_refused(tmp_path: Path) -> None:
    from tokenizers import processors

    folder = checkpoints.decoder(tmp_path / "appends-eos", pad=False)
    tokenizer = checkpoints.decoder_tokenizer(pad=False)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", tokenizer.eos_token_id)]
    )
    tokenizer.save_pretrained(folder)
    _check_refused(folder, "m", tmp_path / "out", "ends every input with its EOS token", "add a pad token")
    folder = checkpoints.decoder(tmp_path / "no-eos", pad=False)
    document = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**document, "eos_token": None}))
    _check_refused(
        folder, "m", tmp_path / "out", "neither the tokenizer nor config.json has a pad token", "pad_token_id"
    )


def test_a_new_head_is_announced_once_instead_of_the_missing_keys_report(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from model_store.data import minilm_checkpoint_path
    from model_store.loading import REPORT_LOGGER, missing_head_keys, new_head_notice

    reports: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reports.append(record.getMessage())

    collect = Collect(level=logging.WARNING)
    logging.getLogger(REPORT_LOGGER).addHandler(collect)
    try:
        with caplog.at_level(logging.INFO, logger="model_store.loading"), new_head_notice():
            for _ in range(2):
                AutoModelForSequenceClassification.from_pretrained(str(minilm_checkpoint_path()), num_labels=3)
        assert not [report for report in reports if "LOAD REPORT" in report]
        notices = [record.getMessage() for record in caplog.records if record.name == "model_store.loading"]
        assert notices == [
            "initialising a new classification head (classifier.bias, classifier.weight); the recipe trains it"
        ]
        AutoModelForSequenceClassification.from_pretrained(str(minilm_checkpoint_path()), num_labels=3)
        assert any("LOAD REPORT" in report for report in reports), "outside the block the report is unchanged"
    finally:
        logging.getLogger(REPORT_LOGGER).removeHandler(collect)
    other = "X LOAD REPORT from: p\nKey | Status |\n---\nclassifier.bias | MISSING |\npooler.bias | UNEXPECTED |"
    assert missing_head_keys(other) is None


def test_max_length_beyond_the_model_positions_is_refused(own: dict[str, Path], tmp_path: Path) -> None:
    assert package_module.validate(own["pairs"], "m").max_length == 128
    capture = io.StringIO()
    with contextlib.redirect_stderr(capture):
        status = package_module.main(
            [str(own["pairs"]), "--name", "m", "--out", str(tmp_path / "out"), "--max-length", "200"]
        )
    assert status == 2 and "max_length 200 exceeds the 128 positions of this bert model" in capture.getvalue()
    assert "--max-length 128 or less" in capture.getvalue() and not (tmp_path / "out").exists()


def test_the_class_config_json_names_is_served_when_the_explainers_accept_it(tmp_path: Path) -> None:
    from transformers import DeiTConfig, DeiTForImageClassificationWithTeacher, ViTImageProcessorPil

    config = DeiTConfig(
        image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
    )
    config.num_labels, config.id2label, config.label2id = 2, {0: "cat", 1: "dog"}, {"cat": 0, "dog": 1}
    folder = tmp_path / "deit"
    DeiTForImageClassificationWithTeacher(config).save_pretrained(folder)
    ViTImageProcessorPil(size={"height": 16, "width": 16}).save_pretrained(folder)
    checkpoint = package_module.validate(folder, "deit")
    assert checkpoint.architecture == "DeiTForImageClassificationWithTeacher" and checkpoint.task == "image"


def test_sharded_weights_and_symlinked_cache_snapshots(own: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshot"
    blobs.mkdir()
    snapshot.mkdir()
    weights = load_file(str(own["pairs"] / "model.safetensors"))
    names = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in halves.items():
        save_file({key: weights[key] for key in keys}, str(blobs / shard), metadata={"format": "pt"})
    weight_map = {key: shard for shard, keys in halves.items() for key in keys}
    (blobs / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for source in own["pairs"].iterdir():
        if source.suffix != ".safetensors":
            shutil.copy(source, blobs / source.name)
    for blob in blobs.iterdir():  # a Hugging Face cache snapshot: every file a link to a blob
        (snapshot / blob.name).symlink_to(blob)
    result = package_module.package(snapshot, "sharded", tmp_path / "store")
    served = result.archive / "model"
    assert all(path.is_file() and not path.is_symlink() for path in served.iterdir())
    assert sorted(path.name for path in served.glob("*.safetensors")) == sorted(halves)
    loaded = AutoModelForSequenceClassification.from_pretrained(str(served), use_safetensors=True)
    torch.testing.assert_close(loaded.state_dict()["classifier.weight"], weights["classifier.weight"])
    (snapshot / "model-00002-of-00002.safetensors").unlink()
    _check_refused(snapshot, "m", tmp_path / "out", "model-00002-of-00002.safetensors", "not in the folder")
