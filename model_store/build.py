"""Build the default model archives: ``python -m model_store.build [--only NAME] [--tiny] [--out DIR] [--force]``.

Without ``--only`` the default models are built (sentiment, digits, entities); the demo causal LM ``writer`` is
opt-in: ``--only writer`` (``make writer``).

For each model, ``<out>/<name>/`` receives:

- ``model/``: a Hugging Face checkpoint folder (``config.json`` with ``id2label``/``label2id``, ``model.safetensors``,
  tokenizer or image-processor files) that ``AutoModelFor...from_pretrained(..., attn_implementation="eager")``
  loads offline;
- ``metrics.json``: held-out accuracy, macro-F1, per-class precision/recall, split sizes, seed, build seconds;
- ``archive/``: the TorchServe ``no-archive`` folder (``MAR-INF/MANIFEST.json``, handler, ``model-config.yaml``,
  ``metrics.json``, ``model/``);
- ``fingerprint.json``: what the model and the archive were built from.

Reuse: the model is retrained only when its fingerprint changes (recipe hyper-parameters, recipe source files,
input data files, library versions); the archive is repackaged when the model, the handler file, the serving
config or the archiver changes. ``--force`` rebuilds both.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    # CLI only, before torch loads OpenMP: on a machine shared with other jobs, spinning OpenMP threads made a
    # 2-thread training step 3.4x slower (3.36 s vs 0.85 s per batch of 32, measured at load 5.7 on 2 cores).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if not sys.stderr.isatty():  # in logs, Hugging Face's own redrawn bars ("Writing model shards") are noise
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import argparse
import contextlib
import fcntl
import json
import logging
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from model_store import default_build_dir
from model_store.archive import MANIFEST_PATH, make_archive
from model_store.fingerprint import (
    read_fingerprints,
    write_fingerprints,
)
from model_store.progress import MODE_ENV, MODES, ProgressSetting, stage
from model_store.specs import (
    ARCHIVE_DIR,
    DEFAULT_GENERATION_HANDLER,
    DEFAULT_IMAGE_HANDLER,
    DEFAULT_NAMES,
    DEFAULT_TEXT_HANDLER,
    DEFAULT_TOKEN_HANDLER,
    METRICS_FILE,
    MODEL_DIR,
    MODEL_NAMES,
    OPT_IN_NAMES,
    TARGETS,
    ModelSpec,
    archive_fingerprint,
    model_fingerprint,
    model_specs,
)

#: Names other modules and tests import from here (the build's command line and its specs).
__all__ = [
    "DEFAULT_GENERATION_HANDLER",
    "DEFAULT_IMAGE_HANDLER",
    "DEFAULT_NAMES",
    "DEFAULT_TEXT_HANDLER",
    "DEFAULT_TOKEN_HANDLER",
    "MODEL_NAMES",
    "OPT_IN_NAMES",
    "BuildResult",
    "ModelSpec",
    "build_all",
    "build_model",
    "build_tiny_archives",
    "main",
    "model_specs",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BuildResult:
    """Outcome of :func:`build_model`."""

    name: str
    build_dir: Path
    model_dir: Path
    archive_dir: Path
    metrics: dict[str, Any]
    trained: bool
    archived: bool
    seconds: float


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing): one build of a model folder at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Use ``threads`` intra-op threads inside the block (unchanged if None), restoring the previous number."""
    import torch

    previous = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _check_targets(name: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """Compare held-out metrics with :data:`TARGETS`; returns ``{"targets": ..., "met": bool}``."""
    targets = TARGETS.get(name, {})
    met = all(metrics["held_out"][key] >= value for key, value in targets.items())
    return {"targets": targets, "met": met}


def build_model(
    spec: ModelSpec, out_dir: Path, *, force: bool = False, progress: ProgressSetting = True, threads: int | None = None
) -> BuildResult:
    """Build (or reuse) one model and its TorchServe archive under ``out_dir/spec.name``.

    Args:
        spec: What to build (see :func:`model_specs`).
        out_dir: Build root; the model goes to ``out_dir/<name>/``.
        force: Rebuild even if the fingerprints are unchanged.
        progress: Report progress (bars on a terminal, lines elsewhere: :mod:`model_store.progress`).
        threads: torch intra-op threads while training (None: torch's default, one per core).

    Returns:
        Paths, metrics, and whether the model was trained and the archive made in this call.

    Raises:
        FileNotFoundError: If the handler file is missing (the model is still trained and kept, so a later call only
            packages it).
    """
    started = time.perf_counter()
    build_dir = out_dir / spec.name
    model_dir = build_dir / MODEL_DIR
    metrics_path = build_dir / METRICS_FILE
    archive_dir = build_dir / ARCHIVE_DIR
    with _locked(out_dir / f".{spec.name}.lock"):
        build_dir.mkdir(parents=True, exist_ok=True)
        stored = read_fingerprints(build_dir)
        model_fp, model_doc = model_fingerprint(spec)
        reusable = (
            not force
            and stored.get("model") == model_fp
            and (model_dir / "config.json").is_file()
            and metrics_path.is_file()
        )
        trained = not reusable
        if reusable:
            logger.info("%s: model up to date (fingerprint %s), reusing %s", spec.name, model_fp[:12], model_dir)
            metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
        else:
            if stored.get("model"):
                logger.info("%s: fingerprint changed (%s), rebuilding", spec.name, _changes(stored, model_doc))
            else:
                logger.info("%s: first build of the model (later runs reuse it while nothing changes)", spec.name)
            staging = build_dir / ".model-staging"
            shutil.rmtree(staging, ignore_errors=True)
            train_started = time.perf_counter()
            with stage(f"{spec.name}: build the model", progress), _torch_threads(threads):
                metrics = spec.train(spec.recipe, staging, progress=progress)
            metrics["build_seconds"] = round(time.perf_counter() - train_started, 1)
            metrics["fingerprint"] = model_fp
            metrics["tiny"] = spec.tiny
            metrics["versions"] = model_doc["versions"]
            if not spec.tiny:
                metrics["targets"] = _check_targets(spec.name, metrics)
                if not metrics["targets"]["met"]:
                    logger.warning("%s: held-out metrics miss the targets %s", spec.name, TARGETS[spec.name])
            write_fingerprints(build_dir, {})  # the old model is about to go: invalidate first
            shutil.rmtree(archive_dir, ignore_errors=True)  # never serve an archive of the old model
            shutil.rmtree(model_dir, ignore_errors=True)
            staging.rename(model_dir)
            metrics_path.write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
            write_fingerprints(build_dir, {"model": model_fp, "model_inputs": model_doc})
            stored = read_fingerprints(build_dir)

        archive_fp, archive_doc = archive_fingerprint(spec, model_fp, metrics_path)
        archived = (
            force or trained or stored.get("archive") != archive_fp or not (archive_dir / MANIFEST_PATH).is_file()
        )
        if archived:
            with stage(f"{spec.name}: package the TorchServe archive", progress):
                serving = replace(
                    spec.serving, extra_handler_keys={**spec.serving.extra_handler_keys, "model_version": archive_fp}
                )  # its records' version
                make_archive(spec.name, spec.handler, model_dir, serving, archive_dir, extra_files=[metrics_path])
            write_fingerprints(build_dir, {**stored, "archive": archive_fp, "archive_inputs": archive_doc})
        else:
            logger.info("%s: archive up to date, reusing %s", spec.name, archive_dir)
    return BuildResult(
        name=spec.name,
        build_dir=build_dir,
        model_dir=model_dir,
        archive_dir=archive_dir,
        metrics=metrics,
        trained=trained,
        archived=archived,
        seconds=time.perf_counter() - started,
    )


def _changes(stored: dict[str, Any], document: dict[str, Any]) -> str:
    """Name the top-level parts of the fingerprint document that differ from the stored one."""
    previous = stored.get("model_inputs", {})
    current = json.loads(json.dumps(document, default=str))  # as stored: tuples become lists
    changed = [key for key in current if previous.get(key) != current[key]]
    return ", ".join(changed) or "unknown"


def build_all(
    out_dir: Path | None = None,
    *,
    only: Sequence[str] = DEFAULT_NAMES,
    tiny: bool = False,
    force: bool = False,
    progress: ProgressSetting = True,
    threads: int | None = None,
    text_handler: Path = DEFAULT_TEXT_HANDLER,
    image_handler: Path = DEFAULT_IMAGE_HANDLER,
    token_handler: Path = DEFAULT_TOKEN_HANDLER,
) -> dict[str, BuildResult]:
    """Build (or reuse) the named models under ``out_dir`` (default: :func:`model_store.default_build_dir`); see
    :func:`build_model`. Returns the results by model name."""
    out_dir = out_dir if out_dir is not None else default_build_dir()
    specs = model_specs(tiny=tiny, text_handler=text_handler, image_handler=image_handler, token_handler=token_handler)
    unknown = sorted(set(only) - set(specs))
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; choose from {sorted(specs)}")
    return {
        name: build_model(specs[name], out_dir, force=force, progress=progress, threads=threads)
        for name in specs
        if name in only
    }


def build_tiny_archives(
    out_dir: Path,
    text_handler: Path = DEFAULT_TEXT_HANDLER,
    image_handler: Path = DEFAULT_IMAGE_HANDLER,
    token_handler: Path = DEFAULT_TOKEN_HANDLER,
) -> dict[str, Path]:
    """Build tiny ``sentiment``, ``digits`` and ``entities`` archives for tests, in seconds; return name -> folder.

    The models are random-init tiny BERT / ViT models (same labels and archive layout as the defaults, fixed seed),
    run through the same recipe code for a few steps, on one torch thread. Reused when already built in ``out_dir``.
    (The tiny ``writer`` is built on its own: ``build_all(out_dir, only=["writer"], tiny=True)``.)
    """
    results = build_all(
        out_dir,
        only=DEFAULT_NAMES,
        tiny=True,
        progress=False,
        threads=1,
        text_handler=text_handler,
        image_handler=image_handler,
        token_handler=token_handler,
    )
    return {name: result.archive_dir for name, result in results.items()}


def _summary(results: dict[str, BuildResult]) -> str:
    """Format one line per built model for the CLI."""
    lines = []
    for result in results.values():
        held_out = result.metrics["held_out"]
        state = "trained" if result.trained else "reused"
        if "perplexity" in held_out:  # the causal LM
            lines.append(
                f"{result.name:<10} {state:<8} perplexity {held_out['perplexity']:.1f}  next-token accuracy "
                f"{held_out['next_token_accuracy']:.4f}  (held-out tweets n={held_out['texts']}, model build "
                f"{result.metrics.get('build_seconds', 0):.0f} s, this run {result.seconds:.1f} s)  archive: "
                f"{result.archive_dir}"
            )
            continue
        lines.append(
            f"{result.name:<10} {state:<8} accuracy {held_out['accuracy']:.4f}  macro-F1 {held_out['macro_f1']:.4f}"
            f"  (test n={held_out['n']}, model build {result.metrics.get('build_seconds', 0):.0f} s,"
            f" this run {result.seconds:.1f} s)  archive: {result.archive_dir}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns the process exit status."""
    parser = argparse.ArgumentParser(prog="python -m model_store.build", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only",
        choices=MODEL_NAMES,
        action="append",
        help=f"build only this model (repeatable; default: {', '.join(DEFAULT_NAMES)}; "
        f"opt-in: {', '.join(OPT_IN_NAMES)})",
    )
    parser.add_argument("--tiny", action="store_true", help="build the seconds-long tiny test models instead")
    parser.add_argument(
        "--out", type=Path, default=None,
        help="build root (default: model_store/build of the working directory: $EXPLAIN_WORKDIR, else the current one)",
    )  # fmt: skip
    parser.add_argument("--force", action="store_true", help="rebuild even if nothing changed")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads while training (default: one per core; 1 with --tiny)"
    )
    parser.add_argument("--text-handler", type=Path, default=DEFAULT_TEXT_HANDLER, help="default: %(default)s")
    parser.add_argument("--image-handler", type=Path, default=DEFAULT_IMAGE_HANDLER, help="default: %(default)s")
    parser.add_argument(
        "--progress",
        choices=("auto", *MODES),
        default="auto",
        help="bars (a terminal), lines (a line at least every 15 s: logs, CI, containers) or off; auto (default): "
        f"${MODE_ENV} if set, else bars on a terminal and lines elsewhere",
    )
    parser.add_argument("--no-progress", action="store_true", help="the same as --progress off")
    parser.add_argument(
        "--require-targets",
        action="store_true",
        help="exit with status 2 if a default model misses its quality targets",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="log warnings only")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(message)s")
    args.out = args.out if args.out is not None else default_build_dir()
    progress: ProgressSetting = False if args.no_progress else (True if args.progress == "auto" else args.progress)
    specs = model_specs(tiny=args.tiny, text_handler=args.text_handler, image_handler=args.image_handler)
    threads = 1 if args.tiny and args.threads is None else args.threads  # tiny models gain nothing from threads
    results: dict[str, BuildResult] = {}
    failed: list[str] = []
    for name in args.only or DEFAULT_NAMES:
        try:
            results[name] = build_model(specs[name], args.out, force=args.force, progress=progress, threads=threads)
        except FileNotFoundError as error:
            logger.error("%s: %s", name, error)
            failed.append(name)
    print(_summary(results))
    if failed:
        print(f"not archived: {', '.join(failed)} (see the errors above)")
        return 1
    if args.require_targets and not all(r.metrics.get("targets", {}).get("met", True) for r in results.values()):
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
