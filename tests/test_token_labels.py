"""The tagging scheme read from id2label and the grouping of predicted tags into spans (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from explainers.tasks.tagging import group_spans, label_scheme, labels_of, parse_tag, span_tags, tags_of_spans

BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
BIOES = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]
BILOU = ["O", "B-PER", "I-PER", "L-PER", "U-PER"]
IO = ["O", "I-PER", "I-LOC"]
BARE = ["O", "PER", "LOC"]
POS = ["NOUN", "VERB", "ADJ", "DET"]


@pytest.mark.parametrize(
    "labels, name",
    [
        (BIO, "BIO"),
        (BIOES, "BIOES"),
        (BILOU, "BIOES"),
        (IO, "IO"),
        (BARE, "IO"),
        (POS, "none"),
        (["O", "B-PER", "I-PER", "DATE"], "none"),  # prefixed and bare names mixed
        (["O"], "none"),
        (["o", "b_per", "i_per"], "BIO"),
        (["B-PER", "I-PER"], "BIO"),  # no O label still reads as BIO
    ],
)
def test_scheme_is_read_from_the_label_names(labels: list[str], name: str) -> None:
    assert label_scheme(labels).name == name


def test_id2label_with_string_keys_and_errors() -> None:
    assert labels_of({"1": "B-PER", "0": "O"}) == ("O", "B-PER")
    with pytest.raises(ValueError, match=r"0\.\.1"):
        labels_of({0: "O", 2: "B-PER"})
    with pytest.raises(ValueError, match="distinct"):
        labels_of(["O", "O"])


def test_parse_tag() -> None:
    assert parse_tag("B-PER").prefix == "B" and parse_tag("B-PER").type == "PER"
    assert parse_tag("L-LOC").prefix == "E" and parse_tag("U-LOC").prefix == "S"
    assert parse_tag("O").outside and not parse_tag("PER").outside
    assert parse_tag("B-").prefix == "" and parse_tag("B-").type == "B-"


def _ids(labels: list[str], names: str) -> list[int]:
    return [labels.index(name) for name in names.split()]


@pytest.mark.parametrize(
    "labels, tags, spans",
    [
        (BIO, "O B-PER I-PER O B-LOC", [(1, 3, "B-PER"), (4, 5, "B-LOC")]),
        (BIO, "B-PER B-PER I-PER", [(0, 1, "B-PER"), (1, 3, "B-PER")]),  # two spans that touch
        (BIO, "B-PER I-LOC I-LOC", [(0, 1, "B-PER"), (1, 3, "I-LOC")]),  # touching spans of two types
        (BIO, "O I-PER I-PER", [(1, 3, "I-PER")]),  # lenient: I- after O starts a span
        (BIOES, "S-PER S-PER B-LOC I-LOC E-LOC", [(0, 1, "S-PER"), (1, 2, "S-PER"), (2, 5, "B-LOC")]),
        (BIOES, "B-PER E-PER I-PER", [(0, 2, "B-PER"), (2, 3, "I-PER")]),
        (IO, "I-PER I-PER I-LOC O I-PER", [(0, 2, "I-PER"), (2, 3, "I-LOC"), (4, 5, "I-PER")]),
        (BARE, "PER PER LOC", [(0, 2, "PER"), (2, 3, "LOC")]),
        (POS, "DET NOUN NOUN", [(0, 1, "DET"), (1, 2, "NOUN"), (2, 3, "NOUN")]),
    ],
)
def test_grouping_examples(labels: list[str], tags: str, spans: list[tuple[int, int, str]]) -> None:
    got = group_spans(_ids(labels, tags), label_scheme(labels))
    assert got == [(start, end, labels.index(label)) for start, end, label in spans]


def test_ineligible_tokens_end_spans_and_never_join_one() -> None:
    tags = _ids(BIO, "B-PER I-PER I-PER I-PER")
    assert group_spans(tags, label_scheme(BIO), [False, True, False, True]) == [(1, 2, 2), (3, 4, 2)]


def test_span_tags() -> None:
    bio, bioes = label_scheme(BIO), label_scheme(BIOES)
    assert span_tags((2, 5, 1), bio) == [1, 2, 2]
    assert span_tags((2, 5, 2), bio) == [2, 2, 2]  # a span read from an I- tag continues with I-
    assert span_tags((0, 3, 1), bioes) == [1, 2, 3]
    assert span_tags((0, 1, 4), bioes) == [4]
    assert span_tags((0, 2, 1), label_scheme(["O", "B-PER"])) == [1, 1]  # no I-PER: the label itself
    with pytest.raises(ValueError, match="empty"):
        span_tags((3, 3, 1), bio)
    with pytest.raises(ValueError, match="label index"):
        span_tags((0, 1, 9), bio)


LABEL_SETS = [BIO, BIOES, BILOU, IO, BARE, POS]


@st.composite
def _rows(draw: st.DrawFn) -> tuple[list[str], list[int], list[bool]]:
    labels = draw(st.sampled_from(LABEL_SETS))
    length = draw(st.integers(0, 14))
    tags = draw(st.lists(st.integers(0, len(labels) - 1), min_size=length, max_size=length))
    eligible = draw(st.lists(st.booleans(), min_size=length, max_size=length))
    return labels, tags, eligible


@settings(max_examples=300, deadline=None)
@given(_rows())
def test_spans_are_ordered_disjoint_eligible_and_never_outside(row: tuple[list[str], list[int], list[bool]]) -> None:
    labels, tags, eligible = row
    scheme = label_scheme(labels)
    spans = group_spans(tags, scheme, eligible)
    covered: set[int] = set()
    previous_end = 0
    for start, end, label in spans:
        assert previous_end <= start < end <= len(tags)
        assert tags[start] == label and label not in scheme.outside
        positions = set(range(start, end))
        assert all(eligible[position] and tags[position] not in scheme.outside for position in positions)
        assert len({scheme.tags[tags[position]].type for position in positions}) == 1
        covered |= positions
        previous_end = end
    # Every eligible non-O token is in exactly one span.
    assert covered == {i for i in range(len(tags)) if eligible[i] and tags[i] not in scheme.outside}


@settings(max_examples=300, deadline=None)
@given(_rows())
def test_spans_written_back_as_tags_group_to_the_same_spans(row: tuple[list[str], list[int], list[bool]]) -> None:
    """What positions= relies on: the result's spans, given back, are the same spans with the same objective."""
    labels, tags, eligible = row
    scheme = label_scheme(labels)
    spans = group_spans(tags, scheme, eligible)
    outside = min(scheme.outside) if scheme.outside else -1
    if outside < 0:
        return
    rewritten = tags_of_spans(spans, scheme, len(tags), outside)
    assert group_spans(rewritten, scheme, eligible) == spans


@settings(max_examples=200, deadline=None)
@given(_rows())
def test_well_formed_predictions_are_their_spans_objective(row: tuple[list[str], list[int], list[bool]]) -> None:
    """For tags written from spans (well formed), each span's objective tags are exactly the predicted tags."""
    labels, tags, _ = row
    scheme = label_scheme(labels)
    if not scheme.outside:
        return
    outside = min(scheme.outside)
    well_formed = tags_of_spans(group_spans(tags, scheme), scheme, len(tags), outside)
    for start, end, label in group_spans(well_formed, scheme):
        assert span_tags((start, end, label), scheme) == well_formed[start:end]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), max_size=12))
def test_the_entities_recipes_metric_reads_spans_as_the_explainers_group_them(row: list[tuple[int, bool]]) -> None:
    """model_store.ner_data.bio_entities (the held-out metric, kept free of the explainers) == group_spans on BIO."""
    from model_store.ner_data import ENTITY_LABELS, bio_entities

    tags, eligible = [tag for tag, _ in row], [flag for _, flag in row]
    scheme = label_scheme(ENTITY_LABELS)
    expected = {(start, end, ENTITY_LABELS[label][2:]) for start, end, label in group_spans(tags, scheme, eligible)}
    assert bio_entities([ENTITY_LABELS[tag] for tag in tags], eligible) == expected
