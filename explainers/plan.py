"""Which rows of a served batch share which pass: a pure function from the rows' requests and their methods'
capabilities to a :class:`BatchPlan` (no model, no tensors).

:func:`explainers.explain_batch` predicts every row from one shared forward; this module decides what that forward
captures and which rows get a gradient pass of their own (:mod:`explainers.execution` runs the plan):

* rows are grouped by method, options, whether they are explained only when unsure and their deadline (a
  :class:`Group`, scored together, abandoned together once its deadline passed);
* rows share a gradient pass only if their gradients come from the same rules on the same attention (their *kind*,
  :func:`pass_kind`): true gradients on eager attention for the methods that read maps (``gae``, ``relevance``), and
  on the model's fused attention, with or without rules, for the others (``grad_x_input``, ``attnlrp``, ``cp_lrp``);
* if every explained row needs gradients of one kind, no row asks for a prediction only and none is explained only
  when unsure, the shared forward is that kind's pass (one forward, one backward, :attr:`BatchPlan.shared` with
  gradient rows);
* otherwise the shared forward takes no gradients: it gives every row's logits and captures what the rows without a
  gradient need (maps, on eager attention; nothing, on fused attention); each kind of gradient rows gets a pass of its
  own over its rows only (:attr:`BatchPlan.own`), so prediction-only rows never wait in a backward and a row on fused
  attention never holds maps because another row needed them;
* a row explained only when unsure is decided from the shared forward's logits (:meth:`BatchPlan.decided`): a
  confident one is skipped; an unsure one whose method needs gradients joins its kind's own pass; an unsure one of
  another method is scored from the shared forward.

A method with forwards of its own (integrated gradients) needs nothing of the shared forward but its logits: its rows
are scored from it like those of a map method, and run their own forwards when scored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from .capture import GRADIENT_NEEDS
from .confidence import RowSkipped
from .deadline import Deadline
from .methods.registry import Method, OptionValue, Rules

PassKind = tuple[Rules | None, str | None]
"""What a gradient pass runs: the rules of its methods (``None``: true gradients) and the fused attention
implementation (``None``: eager attention)."""


def pass_kind(method: Method, fused: str | None) -> PassKind:
    """The gradient pass ``method``'s rows need on a model whose fused attention is ``fused``: its rules, on the fused
    attention unless it reads maps."""
    return method.rules, None if method.reads_maps else fused


@dataclass(frozen=True)
class Ask:
    """One row's valid request.

    Attributes:
        method: the registered method.
        options: its options, resolved (defaults filled in).
        below: explain only when the prediction's confidence is below this (``None``: always).
        deadline: when the row's answer is due (``None``: no deadline).
    """

    method: Method
    options: Mapping[str, OptionValue]
    below: float | None = None
    deadline: Deadline | None = None


@dataclass(frozen=True)
class Group:
    """Rows scored together: one method, the same options, and whether they are explained only when unsure.

    Attributes:
        method: the method.
        options: its options.
        rows: the rows, ascending.
        when_unsure: whether the rows are explained only when unsure.
        deadline: when the rows' answers are due (``None``: no deadline).
    """

    method: Method
    options: Mapping[str, OptionValue]
    rows: tuple[int, ...]
    when_unsure: bool = False
    deadline: Deadline | None = None

    @property
    def needs_capture_gradients(self) -> bool:
        """Whether the rows need gradients from a capture pass (not from forwards of the method's own)."""
        return bool(self.method.needs & GRADIENT_NEEDS)

    @property
    def deferred(self) -> bool:
        """Whether the rows' gradient pass waits for the decision (unsure rows only, in a pass of their own)."""
        return self.when_unsure and self.needs_capture_gradients


@dataclass(frozen=True)
class Pass:
    """One forward of the plan (and its backward, if ``needs`` ask for gradients).

    Attributes:
        needs: what it captures (:data:`explainers.capture.NEEDS`).
        rules: the modified-gradient rules it runs under (``None``: true gradients).
        fused: the fused attention it runs on when ``needs`` read no maps (``None``: eager).
        rows: the shared pass: the rows whose target logit is differentiated (the forward is over every row); a pass
            of its own: the rows it runs over, ascending.
    """

    needs: frozenset[str]
    rules: Rules | None
    fused: str | None
    rows: tuple[int, ...]


@dataclass(frozen=True)
class BatchPlan:
    """Which rows share which pass (module docstring).

    Attributes:
        groups: the rows to score, grouped, in the order of their first row.
        shared: the shared forward over every row.
        own: the gradient passes of their own, one per kind, each over its rows only.
        fused: the model's fused attention (``None``: eager), which the methods that read no maps run on.
        below: for each row explained only when unsure, its threshold (rows not decided yet).
    """

    groups: tuple[Group, ...]
    shared: Pass
    own: tuple[Pass, ...]
    fused: str | None
    below: Mapping[int, float]

    def decided(self, confidence: Sequence[float]) -> tuple[BatchPlan, dict[int, RowSkipped]]:
        """The plan once each row's ``confidence`` (from the shared forward's logits) is known: the rows explained only
        when unsure keep their place if their confidence is below their threshold, and are skipped otherwise; the
        unsure rows whose method needs gradients join their kind's pass of its own.

        Returns:
            The decided plan (no row left to decide) and a :class:`~explainers.confidence.RowSkipped` per skipped row.
        """
        skipped: dict[int, RowSkipped] = {}
        groups: list[Group] = []
        kinds = {(own.rules, own.fused): list(own.rows) for own in self.own}
        for group in self.groups:
            if not group.when_unsure:
                groups.append(group)
                continue
            unsure = tuple(row for row in group.rows if confidence[row] < self.below[row])
            for row in group.rows:
                if row not in unsure:
                    skipped[row] = RowSkipped(group.method.name, float(confidence[row]), self.below[row])
            if not unsure:
                continue
            groups.append(replace(group, rows=unsure))
            if group.deferred:
                kinds.setdefault(pass_kind(group.method, self.fused), []).extend(unsure)
        decided = replace(self, groups=tuple(groups), own=_own_passes(kinds, groups), below={})
        return decided, skipped


def plan_batch(asks: Mapping[int, Ask], fused: str | None, predictions: bool = False) -> BatchPlan:
    """Plan a batch (module docstring).

    Args:
        asks: the valid requests, by row (the rows asking for a prediction only, or whose request was refused, are not
            in it).
        fused: the model's fused attention implementation (``None``: eager).
        predictions: whether a row of the batch asks for its prediction only: it must not wait in a backward, so the
            shared forward then takes no gradients. (A refused row needs only its logits, which every pass gives.)

    Returns:
        The :class:`BatchPlan`.
    """
    keyed: dict[tuple[str, tuple[tuple[str, OptionValue], ...], bool, Deadline | None], list[int]] = {}
    chosen: dict[tuple[str, tuple[tuple[str, OptionValue], ...], bool, Deadline | None], Ask] = {}
    for row in sorted(asks):
        ask = asks[row]
        key = (ask.method.name, tuple(sorted(ask.options.items())), ask.below is not None, ask.deadline)
        keyed.setdefault(key, []).append(row)
        chosen.setdefault(key, ask)
    groups = [Group(chosen[key].method, dict(key[1]), tuple(rows), key[2], key[3]) for key, rows in keyed.items()]
    kinds: dict[PassKind, list[int]] = {}
    others = predictions
    for group in groups:
        if group.needs_capture_gradients and not group.when_unsure:
            kinds.setdefault(pass_kind(group.method, fused), []).extend(group.rows)
        else:
            others = True
    shared_kind = next(iter(kinds)) if len(kinds) == 1 and not others else None
    needs: frozenset[str] = frozenset().union(
        *(
            group.method.needs
            for group in groups
            if not group.deferred and (shared_kind is not None or not group.needs_capture_gradients)
        )
    )
    if shared_kind is None:
        shared = Pass(needs, None, fused, ())
    else:
        shared = Pass(needs, shared_kind[0], shared_kind[1], tuple(sorted(kinds.pop(shared_kind))))
    below = {row: ask.below for row, ask in asks.items() if ask.below is not None}
    return BatchPlan(tuple(groups), shared, _own_passes(kinds, groups), fused, below)


def _own_passes(kinds: Mapping[PassKind, Sequence[int]], groups: Sequence[Group]) -> tuple[Pass, ...]:
    """A pass of its own per kind, over its rows, capturing what the groups with rows in it need."""
    passes = []
    for (rules, fused), rows in kinds.items():
        members = set(rows)
        needs: frozenset[str] = frozenset().union(
            *(group.method.needs for group in groups if members.intersection(group.rows))
        )
        passes.append(Pass(needs, rules, fused, tuple(sorted(rows))))
    return tuple(passes)
