"""What the packaging modules share: the refusal error, the per-model settings a user tunes, the archive-name rule.

A :class:`Settings` comes from the command-line options (:mod:`model_store.package.cli`), a models file's keys of the
same names (:mod:`model_store.package.models_file`) or the defaults; :mod:`model_store.package.validate` checks a
checkpoint against it and :mod:`model_store.package.packaging` writes it into the archive's ``model-config.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

#: A safe TorchServe model / archive name: no path separators, dots or leading dash; at most 64 characters.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

#: A task name: one of :data:`serving_core.registry.TASKS` (whose records say what each task is).
Task = str


class PackageError(ValueError):
    """A checkpoint that cannot be served; the message names the problem and the fix. Nothing was written."""


@dataclass(frozen=True)
class Settings:
    """The per-model settings a user tunes (command-line options or a YAML file's keys of the same names).

    Attributes:
        default_method: Method used when a request asks for an explanation without naming one (``None``:
            ``attnlrp``, the served default, where the architecture supports it (all supported ones do), else ``gae``).
        max_length: Text: tokens per input (both segments of a pair together); longer inputs are truncated
            (``None``: 128, or the model's position limit if smaller). Generation models: a prompt's tokens at most
            (``None``: the model's positions less ``max_new_tokens``, bounded by what
            :data:`~model_store.package.limits.GENERATION_MEMORY_BUDGET_MIB` holds of a batch's explanations; the
            packager logs which limit applied and writes it into ``model-config.yaml``).
        batch_size: TorchServe ``batchSize``: rows per batch.
        max_batch_delay: TorchServe ``maxBatchDelay`` in ms: how long a partial batch waits (a lone request waits
            all of it).
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda``.
        bf16: Run the forward under bfloat16 autocast (GPU).
        threshold: Multi-label heads: probability at or above which a label is predicted (default: the
            checkpoint config's ``threshold`` key, else 0.5).
        workers: TorchServe workers of the model (``minWorkers`` = ``maxWorkers``).
        response_timeout: TorchServe ``responseTimeout`` in s: a slower batch kills the worker.
        explain_below: Explain when unsure, by default: a request asking for an explanation without saying when gets
            it only if the prediction's confidence is below this probability in (0, 1] (``None``: always; a request
            overrides it with ``below``).
        max_new_tokens: Generation models: the most new tokens a request may ask for.
        default_new_tokens: Generation models: new tokens written when a request names none.
        explanation_workers: Workers of the model's explanation pool (``None``: no pool, every request is served by
            the model's own workers). With a pool, requests asking for an explanation are served by their own workers
            and batches, so predictions never wait for a backward (docs/SERVING.md, "Predictions next to
            explanations"); each pool worker holds its own copy of the model.
        explanation_batch_size: The explanation pool's ``batchSize`` (``None``: ``batch_size``).
        explanation_max_batch_delay: The explanation pool's ``maxBatchDelay`` in ms (``None``: ``max_batch_delay``).
        chat_template: Generation models: the Jinja chat template chat ``messages`` are rendered with, instead of the
            checkpoint's own (``tokenizer_config.json`` or ``chat_template.jinja``, which are packaged with it): the
            template itself, or the path of a file holding it (a models file's relative paths are relative to it).
            ``None``: the checkpoint's; a checkpoint with neither serves prompts only (``messages`` are refused).
        monitor: What the explanations say, monitored (docs/MONITORING.md): ``None`` (absent) or ``true``: on with
            the defaults; ``false``: off; a mapping ``{window, window_s, k, baseline, canaries, interval_s,
            capacity, queue}``. The ``baseline`` and ``canaries`` files are validated and copied into the archive
            (:mod:`model_store.package.monitor_files`).
    """

    default_method: str | None = None
    max_length: int | None = None
    batch_size: int = 8
    max_batch_delay: int = 2
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool = False
    threshold: float | None = None
    workers: int = 1
    response_timeout: int = 60
    explain_below: float | None = None
    max_new_tokens: int = 64
    default_new_tokens: int = 16
    explanation_workers: int | None = None
    explanation_batch_size: int | None = None
    explanation_max_batch_delay: int | None = None
    chat_template: str | None = None
    monitor: Any = field(default=None, hash=False)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str) -> Settings:
        """Settings from a YAML mapping; ``where`` names it in error messages.

        Raises:
            PackageError: for an unknown key or a value of the wrong type or range.
        """
        known = {name: default for name, default in asdict(cls()).items()}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise PackageError(f"{where}: unknown setting(s) {unknown}; known: {sorted(known)}")
        settings = cls(**{key: values[key] for key in values})
        settings.check(where)
        return settings

    def explanation_pool(self) -> dict[str, int] | None:
        """The explanation pool's TorchServe batching keys (``None``: no pool)."""
        if self.explanation_workers is None:
            return None
        return {
            "minWorkers": self.explanation_workers,
            "maxWorkers": self.explanation_workers,
            "batchSize": self.explanation_batch_size or self.batch_size,
            "maxBatchDelay": self.explanation_max_batch_delay or self.max_batch_delay,
        }

    def check(self, where: str = "settings") -> None:
        """Check types and ranges.

        Raises:
            PackageError: naming the setting and what it must be.
        """
        from explainers import available_methods

        if self.default_method is not None and self.default_method not in available_methods():
            raise PackageError(f"{where}: default_method {self.default_method!r} is not one of {available_methods()}")
        numbers = ("max_length", "batch_size", "max_batch_delay", "workers", "max_new_tokens", "default_new_tokens")
        for key, low in zip(numbers, (3, 1, 1, 1, 1, 1), strict=True):
            value = getattr(self, key)
            if key == "max_length" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise PackageError(f"{where}: {key} must be an integer >= {low}, got {value!r}")
        for key in ("explanation_workers", "explanation_batch_size", "explanation_max_batch_delay"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise PackageError(f"{where}: {key} must be an integer >= 1, got {value!r}")
        if self.explanation_workers is None and (
            self.explanation_batch_size is not None or self.explanation_max_batch_delay is not None
        ):
            raise PackageError(f"{where}: explanation_batch_size/explanation_max_batch_delay configure the "
                               "explanation pool: set explanation_workers (e.g. 1) to have one")  # fmt: skip
        if isinstance(self.response_timeout, bool) or not isinstance(self.response_timeout, int):
            raise PackageError(f"{where}: response_timeout must be an integer number of seconds")
        if self.response_timeout < 1:
            raise PackageError(f"{where}: response_timeout must be at least 1 s, got {self.response_timeout}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise PackageError(f"{where}: device must be auto, cpu or cuda, got {self.device!r}")
        if not isinstance(self.bf16, bool):
            raise PackageError(f"{where}: bf16 must be true or false, got {self.bf16!r}")
        if self.threshold is not None and not (
            isinstance(self.threshold, int | float) and not isinstance(self.threshold, bool) and 0 < self.threshold < 1
        ):
            raise PackageError(f"{where}: threshold must be a probability in (0, 1), got {self.threshold!r}")
        below = self.explain_below
        if below is not None and (isinstance(below, bool) or not isinstance(below, int | float) or not 0 < below <= 1):
            raise PackageError(f"{where}: explain_below must be a probability in (0, 1], got {below!r}")
        if self.chat_template is not None and (
            not isinstance(self.chat_template, str) or not self.chat_template.strip()
        ):
            raise PackageError(f"{where}: chat_template must be a Jinja template or the path of a file holding one")
        from model_store.package.monitor_files import check_setting

        check_setting(self.monitor, where)

    def chat_template_text(self, base: Path | None = None) -> str | None:
        """The chat template itself: ``chat_template`` when it is a template (it holds ``{{`` or ``{%``), else the
        file it names (relative to ``base`` when given).

        Raises:
            PackageError: for a file that cannot be read.
        """
        value = self.chat_template
        if value is None or "{{" in value or "{%" in value:
            return value
        path = Path(value).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise PackageError(
                f"chat_template {value!r} is neither a Jinja template nor a readable file ({error})"
            ) from None


def check_name(name: str) -> str:
    """Return ``name`` if it is a safe archive name.

    Raises:
        PackageError: naming the rule.
    """
    if not isinstance(name, str) or NAME_PATTERN.fullmatch(name) is None:
        raise PackageError(
            f"{name!r} is not a safe model name: use 1-64 letters, digits, '_' or '-', starting with a letter or "
            "digit (it becomes a folder name and a URL path segment), e.g. --name my-classifier"
        )
    return name
