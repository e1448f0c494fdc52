"""Policy patterns run by the linear-time automaton (policy/pattern.py): the same answers
as Python's ``re.search`` on the syntax it takes, clear refusals for the rest."""

from __future__ import annotations

import random
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamq.policy import pattern
from hamq.policy.pattern import MAX_PROGRAM, PatternError, compile_pattern, search

# The characters a wire name may hold (protocol/message.py) and a few pattern tokens.
_NAME = st.text(alphabet="ab.-_%|1Z", max_size=8)
_ATOMS = ["a", "b", ".", r"\.", r"\d", r"\w", r"\W", "[a-b]", "[^a.]", r"[\d%]", "^", "$"]
_QUANTIFIERS = ["", "", "*", "+", "?", "{2}", "{1,3}", "{,2}", "{2,}", "*?", "+?"]


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
        return  # e.g. too many steps for nested counted repeats
    expected = re.compile(pattern)
    for name in names:
        assert search(pattern, name) == (expected.search(name) is not None), name


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        (r"^ha\.", ["ha.x", "hax", "x.ha.y"]),
        (r"^(orders|billing)\.", ["orders.eu", "billing.", "ordersx"]),
        (r"a{,2}b|{|a{x}", ["b", "{", "a{x}", "aaa"]),
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
        ("(", "missing ), unterminated subpattern"),
        ("a)", "unbalanced parenthesis"),
        ("*a", "nothing to repeat"),
        ("a**", "multiple repeat"),
        ("a++", "possessive quantifiers are not supported"),
        (r"(a)\1", r"escape \1 is not supported"),
        ("(?=a)", "only (?:...) groups"),
        ("(?i)ha", "only (?:...) groups"),
        ("[z-a]", "bad character range"),
        ("[a", "unterminated character set"),
        ("a{1001}", "repeat count out of range"),
        ("(a{100}){100}", f"more than {MAX_PROGRAM} automaton steps"),
    ],
)
def test_what_it_cannot_run_is_refused_with_the_reason(pattern: str, reason: str) -> None:
    with pytest.raises(PatternError, match=re.escape(reason)):
        compile_pattern(pattern)


def test_the_lazy_dfa_stays_bounded_where_its_states_multiply(monkeypatch):
    """``[ab]*a[ab]{6}$`` has 2**7 DFA states: past the bound the automaton forgets what it
    worked out and answers right all the same."""
    monkeypatch.setattr(pattern, "MAX_DFA_THREADS", pattern._Automaton.kept_total + 300)
    expression = "[ab]*a[ab]{6}$"
    rng = random.Random(16)
    names = ["".join(rng.choice("ab") for _ in range(24)) for _ in range(400)]
    for name in names:
        assert search(expression, name) == (re.search(expression, name) is not None), name
        assert pattern._automaton(expression)._kept <= 300


def test_a_hostile_pattern_against_many_long_names_is_quick():
    names = [f"{'a' * (100 + i % 27)}-{i}" for i in range(2000)]
    started = time.monotonic()
    assert not any(search("(a?){170}b|(a+)+$|(a|aa)*c$", name) for name in names)
    assert time.monotonic() - started < 5.0  # Python's re: longer than anyone would wait
