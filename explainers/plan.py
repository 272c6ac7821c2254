"""Which rows of a served batch share which pass: pure functions from the rows' requests (and their methods'
capabilities) to groups and passes (no model, no tensors).

Every head's batch is grouped here, by :func:`group_rows`: each row's :class:`GroupKey` says what decides which rows
can share a forward and a backward (the method, its options, what is explained of the row, whether foils contrast it,
whether it is explained only when unsure, its deadline), and rows with one key form one :class:`RowGroup`, in the order
of their first row. The classifier rows of :func:`explainers.explain_batch`, the token classifier's rows (a
prediction, or every entity explained) and a causal LM's rows (its steps, a sum of steps, or spans of its answer) are
grouped so; each group is one call of the library (one forward for its rows, their targets in one batched backward).

:func:`explainers.explain_batch` then predicts every classifier row from one shared forward; :func:`plan_batch` decides
what that forward captures and which rows get a gradient pass of their own (:mod:`explainers.execution` runs the plan):

* rows are grouped (:func:`group_rows`) by method, options, whether they are explained only when unsure and their
  deadline (a :class:`Group`, scored together, abandoned together once its deadline passed);
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
from typing import Literal

from .capture import GRADIENT_NEEDS
from .confidence import RowSkipped
from .deadline import Deadline
from .methods.registry import Method, OptionValue, Rules

PassKind = tuple[Rules | None, str | None]
"""What a gradient pass runs: the rules of its methods (``None``: true gradients) and the fused attention
implementation (``None``: eager attention)."""


TargetKind = Literal["class", "entities", "steps", "sum", "spans"]
"""What a row's backward differentiates: its class logit (a classifier), each entity it finds (a token classifier),
its steps, a sum of its steps, or spans of its answer (a causal LM)."""


@dataclass(frozen=True)
class GroupKey:
    """What decides which rows share a forward and a backward: rows with equal keys are served as one group.

    Attributes:
        method: the method's name (``None``: a prediction, nothing explained).
        options: its options, as sorted ``(name, value)`` pairs (:meth:`of` sorts them).
        target: what is explained of each row (:data:`TargetKind`).
        summed: for a ``sum`` target, the steps summed, ``(start, stop)`` (``stop`` ``None``: to the end).
        contrast: whether the rows' targets are contrasted with foils.
        when_unsure: whether the rows are explained only when unsure.
        deadline: when the rows' answers are due (``None``: no deadline).
    """

    method: str | None
    options: tuple[tuple[str, OptionValue], ...] = ()
    target: TargetKind = "class"
    summed: tuple[int, int | None] | None = None
    contrast: bool = False
    when_unsure: bool = False
    deadline: Deadline | None = None

    @classmethod
    def of(
        cls,
        method: str | None,
        options: Mapping[str, OptionValue],
        target: TargetKind = "class",
        *,
        summed: tuple[int, int | None] | None = None,
        contrast: bool = False,
        when_unsure: bool = False,
        deadline: Deadline | None = None,
    ) -> GroupKey:
        """The key of a row asking for ``method`` with ``options`` (in any order).

        Args:
            method: the method's name (``None``: a prediction).
            options: its options.
            target: what is explained of the row.
            summed: for a ``sum`` target, the steps summed.
            contrast: whether foils contrast the row's targets.
            when_unsure: whether the row is explained only when unsure.
            deadline: when the row's answer is due.

        Returns:
            The :class:`GroupKey`.
        """
        return cls(method, tuple(sorted(options.items())), target, summed, contrast, when_unsure, deadline)


@dataclass(frozen=True)
class RowGroup:
    """Rows of a batch served together: one forward for them, their targets in one batched backward.

    Attributes:
        key: what the rows share.
        rows: the rows, ascending.
    """

    key: GroupKey
    rows: tuple[int, ...]


def group_rows(keys: Mapping[int, GroupKey]) -> tuple[RowGroup, ...]:
    """Group a batch's rows by their keys: rows with equal keys are served together (one forward for them, their
    targets in one batched backward); rows with different keys never share a group.

    Args:
        keys: each served row's key, by row (a row that is not served, a refused one, is not in it).

    Returns:
        One :class:`RowGroup` per distinct key, in the order of their first row; each group's rows ascending.
    """
    grouped: dict[GroupKey, list[int]] = {}
    for row in sorted(keys):
        grouped.setdefault(keys[row], []).append(row)
    return tuple(RowGroup(key, tuple(rows)) for key, rows in grouped.items())


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
    keys = {
        row: GroupKey.of(ask.method.name, ask.options, when_unsure=ask.below is not None, deadline=ask.deadline)
        for row, ask in asks.items()
    }
    groups = [
        Group(asks[rows[0]].method, dict(key.options), rows, key.when_unsure, key.deadline)
        for key, rows in ((grouped.key, grouped.rows) for grouped in group_rows(keys))
    ]
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
