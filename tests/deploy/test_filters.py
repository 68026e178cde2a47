"""The filter language: round trips, clear errors on malformed input, and what it selects."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploy.errors import PolicyError
from deploy.filters import And, Compare, Field, Filter, FilterSyntaxError, Not, Or, parse, unparse

names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: n not in {"and", "or", "not", "in", "has", "matches", "exists"}
)
fields = st.builds(Field, st.sampled_from(["any", "labels", "attributes"]), names)
values = st.one_of(
    st.text(max_size=12).filter(lambda s: "\x00" not in s),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32).filter(lambda f: not f.is_integer()),
)
comparisons = st.one_of(
    st.builds(Compare, fields, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), st.tuples(values)),
    st.builds(Compare, fields, st.just("in"), st.lists(values, min_size=1, max_size=4).map(tuple)),
    st.builds(Compare, fields, st.just("has"), st.tuples(values)),
    st.builds(
        Compare, fields, st.just("matches"), st.sampled_from([(">=1.2.0",), (">=1.0,<2.0",), ("==2.1.3",)])
    ),
    st.builds(Compare, fields, st.just("exists"), st.just(())),
)


def _flat(cls):
    # the parser flattens a and (b and c) into one And: build trees already flat
    def build(children):
        flat = []
        for child in children:
            flat.extend(child.operands if isinstance(child, cls) else [child])
        return cls(tuple(flat))

    return build


trees = st.recursive(
    comparisons,
    lambda inner: st.one_of(
        st.builds(Not, inner),
        st.lists(inner, min_size=2, max_size=3).map(_flat(And)),
        st.lists(inner, min_size=2, max_size=3).map(_flat(Or)),
    ),
    max_leaves=8,
)


@given(trees)
@settings(max_examples=300)
def test_printing_and_parsing_round_trip(tree):
    text = unparse(tree)
    assert parse(text) == tree
    assert unparse(parse(text)) == text


@given(st.text(max_size=60))
@settings(max_examples=500)
def test_any_text_parses_or_is_refused_with_a_policy_error(text):
    try:
        node = parse(text)
    except PolicyError as exc:
        assert "column" in str(exc) or "filter" in str(exc)
    else:
        assert parse(unparse(node)) == node


@given(
    st.lists(
        st.sampled_from(["a", "==", "1", "and", "or", "not", "(", ")", "[", "]", ",", "in", '"x"', "has"]),
        max_size=12,
    )
)
@settings(max_examples=500)
def test_token_soup_never_escapes_as_another_exception(tokens):
    text = " ".join(tokens)
    try:
        node = parse(text)
    except FilterSyntaxError as exc:
        assert 0 <= exc.position <= len(text)
    else:
        assert parse(unparse(node)) == node


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("hardware ==", "expected a value", 12),
        ("hardware == rpi4 and", "expected a field name", 21),
        ("region == 'eu'", "strings use double quotes", 11),
        ("(ram_mb > 1024", "expected ')'", 15),
        ("app_version matches banana", "not a semver range", 21),
        ("ram_mb = 5", "unexpected character '='", 8),
        ("ram_mb >= 1 region == eu", "expected 'and', 'or'", 13),
        ("tier in [a, b", "expected ',' or ']'", 14),
        ("", "empty filter", 1),
    ],
)
def test_errors_point_at_the_bad_token(text, message, column):
    with pytest.raises(FilterSyntaxError) as caught:
        parse(text)
    assert message in str(caught.value)
    assert f"column {column}" in str(caught.value)
    assert caught.value.position == column - 1
    assert str(caught.value).splitlines()[-1].index("^") - 2 == column - 1


def test_non_string_and_oversized_filters_are_refused():
    with pytest.raises(PolicyError, match="must be a string"):
        parse(42)
    with pytest.raises(FilterSyntaxError, match="longer than"):
        parse("a == b and " * 1000 + "a == b")
    with pytest.raises(FilterSyntaxError, match="nested deeper"):
        parse("not " * 100 + "a == b")


PI = {
    "hardware": "rpi4",
    "ram_mb": "4096",
    "cpu_features": "neon, vfp",
    "app_version": "2.3.1",
    "region": "eu-west",
}


@pytest.mark.parametrize(
    ("text", "attributes", "labels", "expected"),
    [
        ('hardware == "rpi4" and ram_mb >= 2048', PI, {}, True),
        ("ram_mb > 4096", PI, {}, False),
        ("ram_mb == 4096.0", PI, {}, True),
        ("cpu_features has vfp", PI, {}, True),
        ("cpu_features has avx2", PI, {}, False),
        ('app_version matches ">=2.1.0,<3"', PI, {}, True),
        ('app_version matches ">=2.4"', PI, {}, False),
        ("app_version >= 2.3.0", PI, {}, True),
        ("region in [eu-west, eu-north]", PI, {}, True),
        ("site == lab", PI, {"site": "lab"}, True),  # a plain name falls back to labels
        ("labels.region == eu-west", PI, {}, False),  # labels. looks only at labels
        ("attributes.site == lab", PI, {"site": "lab"}, False),
        ("missing != x", PI, {}, False),  # comparisons on a missing field are false
        ("not missing == x", PI, {}, True),
        ("missing exists or region exists", PI, {}, True),
        ("hardware == rpi5 or (region == eu-west and not ram_mb < 1024)", PI, {}, True),
        ("hardware < 5", PI, {}, False),  # neither numbers nor versions: false, not an error
    ],
)
def test_evaluation(text, attributes, labels, expected):
    assert Filter.parse(text)(attributes, labels) is expected


def test_filters_with_the_same_meaning_are_equal():
    assert Filter.parse("a==1 and (b==2)") == Filter.parse("a == 1 and b == 2")
    assert Filter.parse("a == 1").text == "a == 1"
