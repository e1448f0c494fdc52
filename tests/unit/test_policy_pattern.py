"""Policy patterns run on RE2 (policy/pattern.py): the same answers as Python's ``re.search``
on the syntax both share, clear refusals for what an automaton cannot run, and no runaway
match on hostile patterns."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.policy.pattern import PatternError, compile_pattern, search

# The characters a wire name may hold (protocol/message.py) and a few pattern tokens.
_NAME = st.text(alphabet="ab.-_%|1Z", max_size=8)
_ATOMS = ["a", "b", ".", r"\.", r"\d", r"\w", r"\W", "[a-b]", "[^a.]", r"[\d%]", "^", "$"]
_QUANTIFIERS = ["", "", "*", "+", "?", "{2}", "{1,3}", "{2,}", "*?", "+?"]


@st.composite
def _patterns(draw: st.DrawFn, depth: int = 0) -> str:
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        if depth < 1 and draw(st.booleans()):
            inner = "|".join(draw(st.lists(_patterns(depth + 1), min_size=1, max_size=3)))
            atom = draw(st.sampled_from(["(", "(?:"])) + inner + ")"
        else:
            atom = draw(st.sampled_from(_ATOMS))
        quantifier = "" if atom in ("^", "$") else draw(st.sampled_from(_QUANTIFIERS))
        parts.append(atom + quantifier)
    return "".join(parts)


@settings(max_examples=150, deadline=None)
@given(_patterns(), st.lists(_NAME, min_size=1, max_size=5))
def test_it_answers_as_re_search_does(pattern: str, names: list[str]) -> None:
    try:
        compile_pattern(pattern)
    except PatternError:
        return  # e.g. a counted repeat past RE2's bound
    expected = re.compile(pattern)
    for name in names:
        assert search(pattern, name) == (expected.search(name) is not None), name


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        (r"^ha\.", ["ha.x", "hax", "x.ha.y"]),
        (r"^two\.", ["two.a", "two", "a.two.b"]),
        (r"^(orders|billing)\.", ["orders.eu", "billing.", "ordersx"]),
        (r"[]a-][-b]", ["]-", "ab", "-b", "x"]),
        ("", ["", "x"]),
    ],
)
def test_seed_and_corner_patterns_answer_as_re(pattern: str, names: list[str]) -> None:
    for name in names:
        assert search(pattern, name) == (re.search(pattern, name) is not None), name


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(", "missing )"),
        ("a)", "unexpected )"),
        ("*a", "no argument for repetition operator"),
        ("a**", "bad repetition operator"),
        (r"(a)\1", "invalid escape sequence"),
        ("(?=a)", "invalid perl operator"),
        ("[z-a]", "invalid character class range"),
        ("[a", "missing ]"),
        ("a{1001}", "invalid repetition size"),
    ],
)
def test_what_it_cannot_run_is_refused_with_the_reason(pattern: str, reason: str) -> None:
    with pytest.raises(PatternError, match=re.escape(reason)):
        compile_pattern(pattern)


def test_a_hostile_pattern_against_many_long_names_is_quick():
    names = [f"{'a' * (100 + i % 27)}-{i}" for i in range(2000)]
    started = time.monotonic()
    assert not any(search("(a?){170}b|(a+)+$|(a|aa)*c$", name) for name in names)
    assert time.monotonic() - started < 5.0  # Python's re: longer than anyone would wait
