"""Packaging and reuse: a validated checkpoint becomes a TorchServe ``no-archive`` folder ``OUT/NAME/``, written
again only when its fingerprint changed.

The fingerprint covers the copied files' names, sizes and modification times (hashing gigabytes of weights would take
longer than packaging), the content of the monitor's baseline and canary files (copied to the archive's root: a
changed baseline is a new version), the settings as the archive's ``model-config.yaml``, the handler and packaging
code, and the archiver and transformers versions. The checkpoint's files are linked into a staging folder, never
copied from anywhere else.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from model_store import REPO_ROOT, default_build_dir
from model_store.archive import MANIFEST_PATH, ServingConfig, entry_file, make_archive
from model_store.files import file_sha256
from model_store.fingerprint import digest, package_versions
from model_store.package.monitor_files import archived_setting
from model_store.package.settings import Settings
from model_store.package.validate import Checkpoint, validate

logger = logging.getLogger(__name__)

FINGERPRINTS_DIR = ".fingerprints"
PACKAGE_CODE_DIR = Path(__file__).resolve().parent


def default_out() -> Path:
    """Where archives are packaged by default: ``WORKDIR/model_store/build/packages`` (:mod:`supervise.workdir`)."""
    return default_build_dir() / "packages"


def _code_files() -> tuple[str, ...]:
    """The code an archive's behaviour depends on (hashed into the fingerprint): this folder and the archiver wrapper,
    as paths relative to the repository."""
    modules = sorted(str(path.relative_to(REPO_ROOT)) for path in PACKAGE_CODE_DIR.glob("*.py"))
    return (*modules, "model_store/archive.py")


def serving_config(checkpoint: Checkpoint, settings: Settings) -> ServingConfig:
    """The archive's ``model-config.yaml`` for a validated checkpoint."""
    extra: dict[str, Any] = {}
    if checkpoint.threshold is not None:
        extra["threshold"] = checkpoint.threshold
    if checkpoint.pad_token_id is not None:
        extra["pad_token_id"] = checkpoint.pad_token_id
    if settings.explain_below is not None:
        extra["explain_below"] = float(settings.explain_below)
    if settings.monitor is not None:
        extra["monitor"] = archived_setting(settings.monitor)
    if checkpoint.task == "generation":
        extra["max_new_tokens"] = settings.max_new_tokens
        extra["default_new_tokens"] = settings.default_new_tokens
        if checkpoint.chat_template is not None:
            extra["chat_template"] = checkpoint.chat_template
    return ServingConfig(
        task=checkpoint.task,
        labels=checkpoint.labels,
        max_length=checkpoint.max_length,
        image_size=checkpoint.image_size,
        max_image_bytes=2_000_000 if checkpoint.task == "image" else None,
        default_method=checkpoint.default_method,
        device=settings.device,
        autocast_bf16=settings.bf16,
        min_workers=settings.workers,
        max_workers=settings.workers,
        batch_size=settings.batch_size,
        max_batch_delay_ms=settings.max_batch_delay,
        response_timeout_s=settings.response_timeout,
        extra_handler_keys=extra,
        explanation_pool=settings.explanation_pool(),
        notes=() if checkpoint.max_length_reason is None else (checkpoint.max_length_reason,),
    )


def fingerprint(checkpoint: Checkpoint, settings: Settings, name: str) -> tuple[str, dict[str, Any]]:
    """The package's fingerprint and the document it hashes: each copied file's name, size and modification time
    (hashing gigabytes of weights would take longer than packaging), the settings, the handler and packaging code and
    the archiver version."""
    handler = entry_file(checkpoint.task)
    document = {
        "name": name,
        "files": {
            file_name: [source.stat().st_size, source.stat().st_mtime_ns, str(source)]
            for file_name, source in sorted(checkpoint.files.items())
        },
        "model_config": serving_config(checkpoint, settings).to_yaml(),
        "monitor_files": {file_name: file_sha256(source) for file_name, source in checkpoint.monitor_files.items()},
        "code": {path: file_sha256(REPO_ROOT / path) for path in (*_code_files(), str(handler.relative_to(REPO_ROOT)))},
        "versions": package_versions(["torch-model-archiver", "transformers"]),
    }
    return digest(document), document


@dataclass(frozen=True)
class Packaged:
    """Outcome of :func:`package`."""

    name: str
    archive: Path
    checkpoint: Checkpoint
    reused: bool


def package(
    path: Path | str,
    name: str,
    out: Path | None = None,
    settings: Settings | None = None,
    checkpoint: Checkpoint | None = None,
) -> Packaged:
    """Validate ``path`` (unless ``checkpoint`` is its validation already) and write (or reuse) its archive
    ``out/name`` (default ``out``: :func:`default_out`).

    Raises:
        PackageError: if the checkpoint is refused; nothing is written then.
        RuntimeError: if ``torch-model-archiver`` fails.
    """
    settings = settings or Settings()
    checkpoint = checkpoint or validate(path, name, settings)
    for warning in checkpoint.warnings:
        logger.warning("%s: %s", name, warning)
    if checkpoint.max_length_reason is not None:
        logger.info("%s: %s", name, checkpoint.max_length_reason)
    if checkpoint.left_out:
        logger.info("%s: not packaged (not a safe checkpoint file): %s", name, ", ".join(checkpoint.left_out))
    out = out if out is not None else default_out()
    archive = out / name
    stamp = out / FINGERPRINTS_DIR / f"{name}.json"
    expected, document = fingerprint(checkpoint, settings, name)
    try:
        stored = json.loads(stamp.read_text(encoding="utf-8")).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        stored = None
    if stored == expected and (archive / MANIFEST_PATH).is_file():
        logger.info("%s: package up to date, reusing %s", name, archive)
        return Packaged(name, archive, checkpoint, reused=True)
    out.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".stage-{name}-", dir=out) as work:
        stage = Path(work) / "model"
        stage.mkdir()
        for file_name, source in checkpoint.files.items():
            (stage / file_name).symlink_to(source)
        extra_files = []
        for file_name, source in checkpoint.monitor_files.items():  # at the archive's root, under fixed names
            (Path(work) / file_name).symlink_to(source)
            extra_files.append(Path(work) / file_name)
        config = serving_config(checkpoint, settings)
        versioned = replace(config, extra_handler_keys={**config.extra_handler_keys, "model_version": expected})
        make_archive(name, entry_file(checkpoint.task), stage, versioned, archive, extra_files)  # records: version
    stamp.parent.mkdir(exist_ok=True)
    stamp.write_text(json.dumps({"fingerprint": expected, "inputs": document}, indent=2) + "\n", encoding="utf-8")
    logger.info("%s: packaged %s (%s, %s head) -> %s", name, checkpoint.architecture, checkpoint.task,
                checkpoint.head_type, archive)  # fmt: skip
    return Packaged(name, archive, checkpoint, reused=False)
