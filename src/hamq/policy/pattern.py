"""Policy patterns matched in time linear in the name, whatever the pattern.

RabbitMQ matches a policy's pattern with ``re:run`` (PCRE, which gives up a runaway match at
its match limit). Python's ``re`` backtracks without a limit or a timeout: ``(a+)+$``
against a 127-character topic name would run for ages, and the controller leader matches
every policy against every declared topic in each placement round and in LIST_TOPICS, so one
such policy would hang the leader, then each peer elected after it. A pattern is therefore
read here into a Thompson automaton and run with every thread at once, as RE2 does: at most
``len(name) * MAX_PROGRAM`` steps, the same answer on every peer. The syntax is the part of
Python's (and PCRE's) that such an automaton can run: literals, ``.``, classes ``[...]``,
``\\d \\w \\s`` and their negations, ``^ $``, groups ``(...)`` ``(?:...)``, ``|`` and the
quantifiers ``* + ? {m} {m,} {m,n}`` (lazy ones too); backreferences, look-around, inline
flags and possessive quantifiers are refused with the reason.
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass
from typing import Final

# Instructions of the automaton; a pattern that needs more is refused. 512 keeps one match
# of a 192-character wire name under 100,000 steps.
MAX_PROGRAM: Final = 512
MAX_REPEAT: Final = 1000  # RE2's bound on {m,n}
# Thread entries (and transitions) the lazy DFAs of all patterns keep together: some tens
# of MB at most, however many policies there are.
MAX_DFA_THREADS: Final = 1_000_000

_DIGITS = frozenset(string.digits)
_WORD = frozenset(string.ascii_letters + string.digits + "_")
_SPACE = frozenset(" \t\n\r\f\v")
_CLASS_ESCAPES: Final = {
    "d": (_DIGITS, False),
    "D": (_DIGITS, True),
    "w": (_WORD, False),
    "W": (_WORD, True),
    "s": (_SPACE, False),
    "S": (_SPACE, True),
}
_CONTROL_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v"}


class PatternError(ValueError):
    """A pattern this module cannot read; the message says what and where."""


@dataclass(frozen=True)
class CharTest:
    """One character: in any of ``items`` (a set, or its complement when negated), or in
    none of them when ``negated``."""

    items: tuple[tuple[frozenset[str], bool], ...]
    negated: bool = False

    def accepts(self, char: str) -> bool:
        return self.negated != any((char in chars) != neg for chars, neg in self.items)


@dataclass(frozen=True)
class _Cat:
    parts: tuple[Node, ...]


@dataclass(frozen=True)
class _Alt:
    choices: tuple[Node, ...]


@dataclass(frozen=True)
class _Rep:
    node: Node
    low: int
    high: int | None  # None: no upper bound


# Pattern tree; "^" and "$" are the anchors.
Node = CharTest | str | _Cat | _Alt | _Rep
_ANY = CharTest(((frozenset("\n"), False),), negated=True)  # '.': all but a newline


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.pos = 0

    def fail(self, what: str) -> PatternError:
        return PatternError(f"{what} at position {self.pos}")

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        self.pos += 1
        return char

    def alternation(self) -> Node:
        choices = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            choices.append(self.sequence())
        return choices[0] if len(choices) == 1 else _Alt(tuple(choices))

    def sequence(self) -> Node:
        parts: list[Node] = []
        while self.peek() not in ("", "|", ")"):
            parts.append(self.quantified(self.atom()))
        return _Cat(tuple(parts))

    def atom(self) -> Node:
        if self.peek() in ("*", "+", "?") or (self.peek() == "{" and self.counted() is not None):
            raise self.fail("nothing to repeat")
        char = self.take()
        if char == "(":
            if self.text.startswith("?:", self.pos):
                self.pos += 2
            elif self.peek() == "?":
                raise self.fail("only (?:...) groups are supported, not (?...)")
            node = self.alternation()
            if self.take() != ")":
                raise self.fail("missing ), unterminated subpattern")
            return node
        if char in "^$":
            return char
        if char == ".":
            return _ANY
        if char == "[":
            return self.char_class()
        if char == "\\":
            return self.escape()
        return CharTest(((frozenset(char), False),))

    def escape(self) -> CharTest:
        char = self.take()
        if char in _CLASS_ESCAPES:
            return CharTest((_CLASS_ESCAPES[char],))
        if char in _CONTROL_ESCAPES:
            return CharTest(((frozenset(_CONTROL_ESCAPES[char]), False),))
        if char == "" or char.isalnum():
            raise self.fail(f"escape \\{char} is not supported")
        return CharTest(((frozenset(char), False),))

    def char_class(self) -> CharTest:
        negated = self.peek() == "^"
        self.pos += negated
        items: list[tuple[frozenset[str], bool]] = []
        first = True
        while first or self.peek() != "]":
            first = False
            if self.peek() == "":
                raise self.fail("unterminated character set")
            low = self.class_char()
            if isinstance(low, CharTest):
                items.extend(low.items)
                continue
            if self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                high = self.class_char()
                if isinstance(high, CharTest) or ord(high) < ord(low):
                    raise self.fail(f"bad character range {low}-")
                items.append((frozenset(map(chr, range(ord(low), ord(high) + 1))), False))
            else:
                items.append((frozenset(low), False))
        self.pos += 1
        return CharTest(tuple(items), negated)

    def class_char(self) -> str | CharTest:
        char = self.take()
        return self.escape() if char == "\\" else char

    def counted(self) -> tuple[int, int | None, int] | None:
        """``{m}``, ``{m,}``, ``{,n}``, ``{m,n}`` at the position: (low, high, length);
        None where Python reads the brace as a literal."""
        end = self.text.find("}", self.pos)
        if end < 0:
            return None
        low, comma, high = self.text[self.pos + 1 : end].partition(",")
        if not (low or high) or not (low.isdigit() or not low) or not (high.isdigit() or not high):
            return None
        if not comma:
            high = low
        count_high = int(high) if high else None
        return int(low or 0), count_high, end + 1 - self.pos

    def quantified(self, node: Node) -> Node:
        char = self.peek()
        if char in ("*", "+", "?"):
            low, high, length = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char] + (1,)
        elif char == "{" and (count := self.counted()) is not None:
            low, high, length = count
        else:
            return node
        if node in ("^", "$"):
            raise self.fail("nothing to repeat")
        if max(low, high or 0) > MAX_REPEAT or (high is not None and high < low):
            raise self.fail(f"repeat count out of range 0..{MAX_REPEAT}, or min > max")
        self.pos += length
        if self.peek() == "?":  # lazy: the same set of names matches
            self.pos += 1
        if self.peek() in ("*", "+", "?", "{") and (self.peek() != "{" or self.counted()):
            raise self.fail("multiple repeat (possessive quantifiers are not supported)")
        return _Rep(node, low, high)


def _size(node: Node) -> int:
    """Instructions ``node`` compiles to (computed before compiling, so a pattern like
    ``(a{1000}){1000}`` is refused without building anything)."""
    if isinstance(node, _Cat):
        return sum(_size(part) for part in node.parts)
    if isinstance(node, _Alt):
        return sum(_size(choice) + 2 for choice in node.choices)
    if isinstance(node, _Rep):
        size = _size(node.node)
        if node.high is None:
            return node.low * size + size + 2
        return node.low * size + (node.high - node.low) * (size + 1)
    return 1


# An instruction: (op, x, y, test). "test" reads a character that ``test`` accepts, "split"
# goes on at x and at y, "jmp" at x, "^" / "$" go on at the start / end, "match" matched.
Instruction = tuple[str, int, int, CharTest | None]


def _emit(node: Node, program: list[Instruction]) -> None:
    if isinstance(node, CharTest):
        program.append(("test", 0, 0, node))
    elif isinstance(node, str):
        program.append((node, 0, 0, None))
    elif isinstance(node, _Cat):
        for part in node.parts:
            _emit(part, program)
    elif isinstance(node, _Alt):
        jumps = []
        for choice in node.choices[:-1]:
            split = len(program)
            program.append(("split", 0, 0, None))
            _emit(choice, program)
            jumps.append(len(program))
            program.append(("jmp", 0, 0, None))
            program[split] = ("split", split + 1, len(program), None)
        _emit(node.choices[-1], program)
        for jump in jumps:
            program[jump] = ("jmp", len(program), 0, None)
    else:
        for _ in range(node.low):
            _emit(node.node, program)
        optional = 1 if node.high is None else node.high - node.low
        for _ in range(optional):
            split = len(program)
            program.append(("split", 0, 0, None))
            _emit(node.node, program)
            if node.high is None:
                program.append(("jmp", split, 0, None))  # again, as often as it reads
            program[split] = ("split", split + 1, len(program), None)


@functools.lru_cache(maxsize=1024)
def compile_pattern(pattern: str) -> tuple[Instruction, ...]:
    """The automaton of ``pattern``; ``PatternError`` saying why it cannot be run."""
    parser = _Parser(pattern)
    tree = parser.alternation()
    if parser.pos < len(pattern):
        raise parser.fail("unbalanced parenthesis")
    if _size(tree) + 1 > MAX_PROGRAM:
        raise PatternError(
            f"too complex: it needs more than {MAX_PROGRAM} automaton steps per character"
        )
    program: list[Instruction] = []
    _emit(tree, program)
    program.append(("match", 0, 0, None))
    return tuple(program)


def _follow(
    program: tuple[Instruction, ...], starts: list[int], bol: bool, eol: bool
) -> frozenset[int]:
    """The instructions reachable from ``starts`` without reading a character, at the start
    of the name (``bol``) or not, at its end (``eol``) or not: one walk for all threads,
    each instruction visited once."""
    seen: set[int] = set()
    stack = starts
    while stack:
        pc = stack.pop()
        if pc in seen:
            continue
        seen.add(pc)
        op, x, y, _ = program[pc]
        if op == "split":
            stack.extend((y, x))
        elif op == "jmp":
            stack.append(x)
        elif (op == "^" and bol) or (op == "$" and eol):
            stack.append(pc + 1)
    return frozenset(seen)


class _Automaton:
    """A program run as RE2's lazy DFA: the set of live threads is a state, and the state
    a character leads to is worked out once (``len(program)`` steps) and then looked up, so
    matching thousands of topic names costs a dictionary lookup per character. The states
    kept are bounded (``MAX_DFA_THREADS`` thread entries and transitions over all patterns,
    past which the pattern adding one forgets its own and works them out again), so a
    pattern whose states multiply costs time, never unbounded memory."""

    kept_total = 0

    def __init__(self, program: tuple[Instruction, ...]) -> None:
        self.program = program
        self.match_pc = len(program) - 1
        self._start = _follow(program, [0], bol=True, eol=False)
        # Only the thread a new match starts with: a state that is this and reads nothing
        # more (a pattern anchored with ^ that failed) stays so to the end of the name.
        self._restart = _follow(program, [0], bol=False, eol=False)
        self._kept = 0  # thread entries and transitions (all patterns': kept_total)
        self._forget()

    def _forget(self) -> None:
        # A state is a number: its threads, transitions by character, match at the end.
        self._ids: dict[frozenset[int], int] = {}
        self._threads: list[frozenset[int]] = []
        self._next: list[dict[str, int]] = []
        self._ends: list[bool | None] = []
        self._matched: list[bool] = []  # holds the match: the name matches
        self._settled: list[bool] = []  # no character can change it (see _restart)
        type(self).kept_total -= self._kept
        self._kept = 0
        self._id(self._start)

    def _id(self, threads: frozenset[int]) -> int:
        known = self._ids.get(threads)
        if known is not None:
            return known
        self._ids[threads] = len(self._threads)
        self._threads.append(threads)
        self._next.append({})
        self._ends.append(None)
        self._matched.append(self.match_pc in threads)
        reads = any(self.program[pc][3] is not None for pc in threads)
        self._settled.append(threads == self._restart and not reads)
        self._keep(len(threads))
        return len(self._threads) - 1

    def _keep(self, cost: int) -> None:
        self._kept += cost
        type(self).kept_total += cost

    def search(self, name: str) -> bool:
        state = 0
        for char in name:
            if self._matched[state]:
                return True
            if self._settled[state]:
                break
            following = self._next[state].get(char)
            if following is None:
                following = self._step(state, char)
            state = following
        # the last state again, at the end of the name ("$"; "^" too if it is empty)
        if not name:
            return self.match_pc in _follow(self.program, list(self._start), bol=True, eol=True)
        ends = self._ends[state]
        if ends is None:
            threads = list(self._threads[state])
            ends = self._ends[state] = self.match_pc in _follow(
                self.program, threads, bol=False, eol=True
            )
        return ends

    def _step(self, state: int, char: str) -> int:
        program = self.program
        read = [
            pc + 1 for pc in self._threads[state] if (test := program[pc][3]) and test.accepts(char)
        ]
        # and a new thread: a match may start at any character
        following = _follow(program, [*read, 0], bol=False, eol=False)
        if type(self).kept_total + len(following) + 1 > MAX_DFA_THREADS:
            self._forget()  # the numbers start again; the search goes on from this one's
            return self._id(following)
        target = self._id(following)
        self._next[state][char] = target
        self._keep(1)
        return target

    def __del__(self) -> None:  # dropped from _automaton's cache: its states go too
        type(self).kept_total -= self._kept


@functools.lru_cache(maxsize=256)
def _automaton(pattern: str) -> _Automaton:
    return _Automaton(compile_pattern(pattern))


def search(pattern: str, name: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``name`` (``re.search``'s answer), in at most
    ``len(name) * MAX_PROGRAM`` steps. The pattern must have been checked."""
    return _automaton(pattern).search(name)
