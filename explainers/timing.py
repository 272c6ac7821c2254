"""How long an explanation takes, estimated before it runs; the per-request time budget that refuses it; and the
deadline a request may carry, honoured between chunks of work.

**The cost model.** Each method declares at its registration how many *forward equivalents* one row costs
(:class:`~explainers.methods.Cost`, :attr:`~explainers.methods.Method.cost`): a function of its options and of the
row's length ``n`` (integrated gradients: ``n_steps`` forwards and as many backwards; occlusion: ``n + 1`` forwards;
a gradient method: one grad-enabled forward and its backward). A model's speed (:class:`ModelSpeed`) is measured once,
on the loaded model and its device, by timing forwards of one row at a short and at the longest length and of a
batch at the longest (:meth:`ModelSpeed.measure`): a fixed ``call`` time per forward and a ``token`` time per token,
each multiplied by a safety factor (:data:`SAFETY`) so that the estimate errs high. A row of ``n`` tokens then costs

    seconds = (1 + calls(options, n)) × call + (1 + forwards(options, n)) × token × n
              + (setup + solver(n, layers)) × python

(the ``1`` is its share of the shared forward that predicts every row; ``forwards`` counts the work in forwards of the
row, ``calls`` the forward calls it takes, fewer where copies of the row share a call; ``setup`` (:data:`SETUP_JOBS`)
is an explained row's fixed work outside the model and ``solver`` the time a method spends outside it, attention
flow's maximum flows, both counted in ``python``: the measured time of a fixed pure-Python job, :func:`reference_job`,
so that they follow the machine's speed and load as the forwards do).
:func:`estimate_seconds` computes it; ``bench/timing.py`` measures it against the actual time over methods and lengths
(docs/SERVING.md, "Time budgets and deadlines", has the figures).
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .architectures.description import Architecture, model_config
from .errors import ExplainError
from .inputs import model_device
from .methods.registry import Method, OptionValue, get_method

#: The factor the measured speed is multiplied by: the measurement is one forward on an idle moment, the explanation
#: may run while other work shares the cores; ``bench/timing.py`` shows the estimates stay above the actual times.
SAFETY = 3.0
#: Forwards timed per length when measuring a model's speed (the median is kept).
REPEATS = 3
#: The short length a text model's speed is measured at (besides the longest), to separate the per-call time.
SHORT_LENGTH = 8
#: The longest length a speed is measured at: a causal LM served at thousands of positions is probed here (a batch
#: of its longest rows would take minutes and gigabytes at load); longer rows are estimated on the per-token line,
#: and the batches served correct it (:class:`~explainers.served_speed.ServedSpeed`).
LONGEST_PROBE = 512


class TimeBudgetError(ExplainError):
    """The explanation is estimated to take longer than the per-request time budget allows (refused before it ran).

    Attributes:
        beside: whether the row fits the budget alone and is refused only beside the rows already admitted to its
            batch ("alone it fits: retry").
    """

    beside: bool = False


#: Rows of the batched forward whose time gives the per-token time (:meth:`ModelSpeed.measure`).
BATCH_ROWS = 8
#: Iterations of the pure-Python reference job (:func:`reference_job`).
REFERENCE_ITERATIONS = 200_000
#: An explained row's fixed work outside the model (validation, planning, hooks, packaging), in reference jobs.
SETUP_JOBS = 4.0
#: A generation step's work outside the model (sampling, the stopping rules), in reference jobs.
STEP_JOBS = 0.2
#: A cached generation step's reading of one earlier token, in per-token forward times (attention only: the
#: per-token time also counts the layers' matrix products, which a cached token does not redo).
CACHE_READ = 0.1


@dataclass(frozen=True)
class ModelSpeed:
    """A model's measured forward time, safety factor included: ``call + token × n`` seconds for one row of ``n``;
    and the time of a reference job of the machine's Python, which a method's solver time is counted in.

    Attributes:
        call: seconds per forward call, whatever its length.
        token: seconds per token of a forward.
        python: seconds of :func:`reference_job` (the unit of :attr:`~explainers.methods.Cost.solver`).
        layers: the model's blocks (a solver's work may grow with them).
        step: seconds of one cached generation step of one row (a causal LM; 0: not measured, the per-call time
            is used).
    """

    call: float
    token: float
    python: float = 0.0
    layers: int = 1
    step: float = 0.0

    @property
    def step_seconds(self) -> float:
        """Seconds of one generation step: the measured :attr:`step`, else a forward call of one token."""
        return self.step if self.step > 0 else self.call + self.token

    def forward_seconds(self, length: int) -> float:
        """Estimated seconds of one forward of one row of ``length`` tokens."""
        return self.call + self.token * length

    @classmethod
    def measure(cls, model: nn.Module, arch: Architecture, longest: int, safety: float = SAFETY) -> ModelSpeed:
        """Time forwards of one row on ``model`` (on its device, without gradients; the model is not changed).

        Text models are timed at one row of :data:`SHORT_LENGTH` tokens (the per-call time), and at one row and
        :data:`BATCH_ROWS` rows of ``longest`` tokens: the per-token time is the larger of the two slopes above the
        short forward (one row, for the methods that run one; many rows, for those that batch copies of a row). Both
        are multiplied by ``safety``. An image model has one length (its patches): its forward is timed at it and kept
        as the per-call time, and a batch of it gives the per-token time the same way.

        Args:
            model: the loaded model.
            arch: its description (:func:`~explainers.describe`).
            longest: the longest input served, in tokens (a text model's ``max_length``; at most
                :data:`LONGEST_PROBE` is measured; ignored for images).
            safety: the factor the measured times are multiplied by.
        """
        python = reference_job() * safety
        with torch.no_grad():  # the first forwards of a loaded model allocate and initialise: not what is measured
            model(**_probe_inputs(model, arch, SHORT_LENGTH if arch.modality == "text" else 0))
        if arch.modality == "image":
            one = _probe_inputs(model, arch, 0)
            seconds = _median_forward(model, one)
            patches = arch.prefix_tokens + _patches(model)
            batched = _median_forward(model, {key: value.repeat(BATCH_ROWS, 1, 1, 1) for key, value in one.items()})
            token = max(batched - seconds, 0.0) / ((BATCH_ROWS - 1) * patches)
            return cls(seconds * safety, token * safety, python, arch.num_layers)
        longest = min(max(int(longest), SHORT_LENGTH + 1), LONGEST_PROBE)
        short = _median_forward(model, _probe_inputs(model, arch, SHORT_LENGTH))
        long = _probe_inputs(model, arch, longest)
        single = _median_forward(model, long)
        batched = _median_forward(model, {key: value.repeat(BATCH_ROWS, 1) for key, value in long.items()})
        token = max(single - short, 0.0) / (longest - SHORT_LENGTH)
        token = max(token, max(batched - short, 0.0) / (BATCH_ROWS * longest - SHORT_LENGTH))
        step = _median_step(model, long) if arch.task == "causal_lm" else 0.0
        # Per-token time grows with the length (attention): the line through the longest length errs high below it.
        return cls(short * safety, token * safety, python, arch.num_layers, step * safety)


def reference_job() -> float:
    """Median seconds of a fixed pure-Python loop (:data:`REFERENCE_ITERATIONS` additions): how fast this machine's
    Python runs now, the unit a method's solver time is declared in."""
    seconds: list[float] = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        total = 0
        for value in range(REFERENCE_ITERATIONS):
            total += value
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def _patches(model: nn.Module) -> int:
    config: Any = model_config(model)
    size, patch = int(getattr(config, "image_size", 224)), int(getattr(config, "patch_size", 16))
    return (size // patch) ** 2


def _probe_inputs(model: nn.Module, arch: Architecture, length: int) -> dict[str, torch.Tensor]:
    """One row to time: ``length`` copies of one ordinary token id for text, a blank image for images."""
    device = model_device(model)
    config: Any = model_config(model)
    if arch.modality == "image":
        size = int(getattr(config, "image_size", 224))
        channels = int(getattr(config, "num_channels", 3))
        return {"pixel_values": torch.zeros((1, channels, size, size), device=device)}
    vocabulary = int(getattr(arch.input_embeddings, "num_embeddings", 2))
    ids = torch.full((1, length), min(100, vocabulary - 1), dtype=torch.long, device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _median_step(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> float:
    """Median seconds of a cached generation step of one row after ``inputs`` (a causal LM's forward of one new token
    reading the cache of the whole row; the cache is made once and each timed step starts from it)."""
    device = model_device(model)
    seconds: list[float] = []
    with torch.no_grad():
        prefill = model(**inputs, use_cache=True)
        cache = prefill.cache if "cache" in prefill else prefill.past_key_values
        if cache is None:
            return 0.0
        mask = torch.cat([inputs["attention_mask"], torch.ones_like(inputs["attention_mask"][:, :1])], dim=1)
        token = inputs["input_ids"][:, -1:]
        for _ in range(REPEATS):
            copied = copy.deepcopy(cache)
            started = time.perf_counter()
            model(input_ids=token, attention_mask=mask, cache=copied, use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def _median_forward(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> float:
    """Median seconds of :data:`REPEATS` forwards (the median leaves out a first one that warms up)."""
    seconds: list[float] = []
    device = model_device(model)
    with torch.no_grad():
        for _ in range(REPEATS):
            started = time.perf_counter()
            model(**inputs)
            if device.type == "cuda":  # kernels run asynchronously: wait for them
                torch.cuda.synchronize(device)
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def estimate_seconds(
    speed: ModelSpeed,
    method: str | Method,
    length: int,
    options: Mapping[str, OptionValue],
    rows: int = 1,
    targets: int = 1,
) -> float:
    """Estimated seconds to predict and explain ``rows`` rows of ``length`` tokens with ``method`` (module docstring),
    each for ``targets`` targets (a token classifier's entities, a generation's explained steps): every target after
    the first adds its :meth:`~explainers.methods.Cost.target_forwards` (its backward passes; forwards are shared) at
    the per-token time, batched into the first target's calls, and its solver time.

    Args:
        speed: the model's measured speed (:meth:`ModelSpeed.measure`).
        method: a registered method, or its name.
        length: the row's length in tokens (patches for images).
        options: the method's options (as validated: defaults filled in).
        rows: rows of that length and method.
        targets: targets explained per row (at least 1).

    Returns:
        The estimate in seconds; it errs high.

    Raises:
        UnknownMethodError: for a name that is not registered.
    """
    chosen = get_method(method) if isinstance(method, str) else method
    cost = chosen.cost
    further = max(int(targets), 1) - 1
    first = cost.forwards(options, length)
    forwards = first + further * cost.target_forwards(options, length)
    # the targets' gradients are batched into the same calls (a vmap over the backward): they add work, not calls
    calls = first if cost.calls is None else cost.calls(options, length)
    work = (1.0 + calls) * speed.call + (1.0 + forwards) * speed.token * length
    solver = (1 + further) * cost.solver(length, speed.layers)
    return rows * (work + (SETUP_JOBS + solver) * speed.python)


def generation_seconds(speed: ModelSpeed, prompt_length: int, new_tokens: int) -> float:
    """Estimated seconds to write ``new_tokens`` tokens after a prompt of ``prompt_length`` tokens: the prompt's
    forward, then one cached forward call per new token (:attr:`ModelSpeed.step`, each also reading the cache of every
    token before it, counted at the per-token time), with :data:`STEP_JOBS` of Python work per step (sampling,
    stopping rules).

    Args:
        speed: the model's measured speed.
        prompt_length: the prompt's length in tokens.
        new_tokens: the tokens written after it.
    """
    if new_tokens <= 0:
        return 0.0
    last = prompt_length + new_tokens
    cache_reads = new_tokens * (prompt_length + last) / 2.0 * speed.token * CACHE_READ
    steps = new_tokens * (speed.step_seconds + STEP_JOBS * speed.python)
    return speed.forward_seconds(prompt_length) + steps + cache_reads


def prediction_seconds(speed: ModelSpeed, length: int) -> float:
    """Estimated seconds of a row that asks for its prediction only (its share of the shared forward).

    Args:
        speed: the model's measured speed.
        length: the row's length in tokens.
    """
    return speed.forward_seconds(length)


def check_time_budget(
    speed: ModelSpeed,
    method: Method,
    length: int,
    options: Mapping[str, OptionValue],
    budget_s: float | None,
    alternatives: Iterable[str] = (),
    admitted_s: float = 0.0,
    rows: int = 1,
    targets: int = 1,
    generate_s: float = 0.0,
) -> float:
    """Refuse (before any work) ``rows`` rows of ``length`` tokens whose estimate exceeds ``budget_s``, alone or beside
    ``admitted_s`` seconds of rows already admitted to their batch.

    Args:
        speed: the model's measured speed.
        method: the method asked for.
        length: the row's length in tokens (for a generation: prompt and new tokens).
        options: the method's options (defaults filled in).
        budget_s: the budget in seconds (``None``: none; the estimate is still returned).
        alternatives: methods the row may use instead (named in the refusal when they fit at their defaults).
        admitted_s: seconds of the rows already admitted to the batch.
        rows: rows of that length and method.
        targets: targets explained per row (entities, steps; :func:`estimate_seconds`).
        generate_s: seconds of the row's generation before it is explained (:func:`generation_seconds`).

    Returns:
        The estimate in seconds.

    Raises:
        TimeBudgetError: naming the estimate, the budget and what fits: the largest value of the option that decides
            the cost, or the ``alternatives`` (methods, at their default options) that fit.
    """

    def estimate(chosen: str | Method, chosen_options: Mapping[str, OptionValue]) -> float:
        return generate_s + estimate_seconds(speed, chosen, length, chosen_options, rows, targets)

    needed = estimate(method, options)
    if _fits_beside(f"method {method.name!r} for {length} tokens", needed, admitted_s, budget_s):
        return needed
    assert budget_s is not None
    hints = [f"{name} <= {value}" for name, value in _largest_fitting(estimate, method, options, budget_s).items()]
    fitting = sorted(name for name in alternatives if name != method.name and estimate(name, {}) <= budget_s)
    choices = []
    if hints:
        choices.append(f"{', '.join(hints)} fits")
    if fitting:
        choices.append(f"methods that fit: {', '.join(fitting)}")
    if targets > 1:
        choices.append("or explain fewer targets (steps or entities)")
    choices.append("or send fewer tokens")
    size = f"{length} tokens" if rows == 1 else f"{rows} x {length} tokens"
    if targets > 1:
        size += f" and {targets} targets"
    if generate_s > 0:
        size += f" (generating them: {generate_s:.1f} s)"
    raise TimeBudgetError(
        f"method {method.name!r} with {_shown(options)} needs about {needed:.1f} s for {size}, over the time "
        f"budget of {budget_s:.1f} s; {'; '.join(choices)}"
    )


def check_generation_budget(
    speed: ModelSpeed, prompt_length: int, new_tokens: int, budget_s: float | None, admitted_s: float = 0.0
) -> float:
    """Refuse a generation row that explains nothing whose writing alone is estimated over ``budget_s`` (alone, or
    beside ``admitted_s`` seconds already admitted to its batch); returns the estimate.

    Args:
        speed: the model's measured speed.
        prompt_length: the prompt's length in tokens.
        new_tokens: the tokens the row asks to write (``max_new_tokens``).
        budget_s: the budget in seconds (``None``: none; the estimate is still returned).
        admitted_s: seconds of the rows already admitted to the batch.

    Raises:
        TimeBudgetError: naming the estimate, the budget and the most new tokens that fit.
    """
    needed = generation_seconds(speed, prompt_length, new_tokens)
    if _fits_beside(f"writing {new_tokens} tokens", needed, admitted_s, budget_s):
        return needed
    assert budget_s is not None
    low, high = 0, new_tokens
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if generation_seconds(speed, prompt_length, middle) <= budget_s else (low, middle)
    raise TimeBudgetError(
        f"writing {new_tokens} tokens after a prompt of {prompt_length} tokens needs about {needed:.1f} s, over the "
        f"time budget of {budget_s:.1f} s; max_new_tokens <= {low} fits, or send a shorter prompt"
    )


def check_explanation_budget(
    speed: ModelSpeed,
    method: Method,
    length: int,
    options: Mapping[str, OptionValue],
    budget_s: float,
    spent_s: float,
    targets: int,
    what: str = "",
    alternatives: Iterable[str] = (),
) -> float:
    """Admit the explanation of an answer already written (a generation row's actual sentences or steps) into what
    ``spent_s`` seconds (the writing's actual time, the explanations admitted before it) left of ``budget_s``.

    Args:
        speed: the model's speed.
        method: the method asked for.
        length: the tokens of prompt and answer.
        options: the method's options (defaults filled in).
        budget_s: the batch's time budget in seconds.
        spent_s: the seconds of it already spent or admitted.
        targets: the answer's targets (at least 1).
        what: the targets in words (``3 sentences``; default: ``{targets} targets``).
        alternatives: methods the row may use instead (named when they fit at their defaults).

    Returns:
        The estimate in seconds.

    Raises:
        TimeBudgetError: naming the estimate, what was left and what fits: fewer targets, a smaller value of the
            option that decides the cost, or the ``alternatives`` that fit.
    """
    targets = max(int(targets), 1)
    needed = estimate_seconds(speed, method, length, options, targets=targets)
    left = budget_s - spent_s
    if needed <= left:
        return needed
    what = what or f"{targets} targets"
    choices: list[str] = []
    if left > 0:
        fewer = 0
        for count in range(targets - 1, 0, -1):
            if estimate_seconds(speed, method, length, options, targets=count) <= left:
                fewer = count
                break
        if fewer:
            choices.append(f"explaining at most {fewer} of them fits")

        def estimate(chosen: str | Method, chosen_options: Mapping[str, OptionValue]) -> float:
            return estimate_seconds(speed, chosen, length, chosen_options, targets=targets)

        hints = [f"{name} <= {value}" for name, value in _largest_fitting(estimate, method, options, left).items()]
        if hints:
            choices.append(f"{', '.join(hints)} fits")
        fitting = sorted(name for name in alternatives if name != method.name and estimate(name, {}) <= left)
        if fitting:
            choices.append(f"methods that fit: {', '.join(fitting)}")
    choices.append("or ask for a shorter answer (max_new_tokens)")
    raise TimeBudgetError(
        f"the answer is written, but explaining its {what} with method {method.name!r} ({_shown(options)}) needs "
        f"about {needed:.1f} s for {length} tokens, and {max(left, 0.0):.1f} s of the time budget of {budget_s:.1f} s "
        f"are left after writing ({spent_s:.1f} s spent); {'; '.join(choices)}"
    )


def _fits_beside(what: str, needed: float, admitted_s: float, budget_s: float | None) -> bool:
    """Whether ``needed`` seconds fit the budget beside ``admitted_s`` (``False``: over the budget alone).

    Raises:
        TimeBudgetError: "alone it fits: retry" (its ``beside`` set), when only the rows already admitted to the
            batch leave no room.
    """
    if budget_s is None or admitted_s + needed <= budget_s:
        return True
    if needed <= budget_s:
        error = TimeBudgetError(
            f"{what} needs about {needed:.1f} s, and the batch it joined already needs {admitted_s:.1f} s of the "
            f"per-batch time budget of {budget_s:.1f} s; alone it fits: retry"
        )
        error.beside = True
        raise error
    return False


def _shown(options: Mapping[str, OptionValue]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sorted(options.items())) or "its defaults"


def _largest_fitting(
    estimate: Callable[[str | Method, Mapping[str, OptionValue]], float],
    method: Method,
    options: Mapping[str, OptionValue],
    budget_s: float,
) -> dict[str, int]:
    """For each integer option the cost grows with: the largest value (below the requested one, down to its minimum)
    with which the row fits the budget, the other options unchanged; options the cost ignores are left out."""
    found: dict[str, int] = {}
    for name, value in options.items():
        if not isinstance(value, int) or isinstance(value, bool):
            continue  # real-valued options (SmoothGrad's stdev) cost nothing: only counts are searched
        low = 1 if value >= 1 else value

        def fits(candidate: int, name: str = name) -> bool:
            return estimate(method, {**options, name: candidate}) <= budget_s

        if estimate(method, {**options, name: low}) >= estimate(method, options):
            continue  # the cost does not grow with this option
        if not fits(low):
            continue
        good, bad = low, value
        while bad - good > 1:
            middle = (good + bad) // 2
            good, bad = (middle, bad) if fits(middle) else (good, middle)
        found[name] = good
    return found
