"""Policy patterns matched in time linear in the name, whatever the pattern.

RabbitMQ matches a policy's pattern with ``re:run`` (PCRE, which gives up a runaway match at
its match limit). Python's ``re`` backtracks without a limit or a timeout: ``(a+)+$``
against a 127-character topic name would run for ages, and the controller leader matches
every policy against every declared topic in each placement round and in LIST_TOPICS, so one
such policy would hang the leader, then each peer elected after it. Patterns therefore run
on RE2 (google-re2): an automaton, linear in the name, the same answer on every peer. Its
syntax is PCRE's without what an automaton cannot run (backreferences, look-around), which
is refused when the policy is set, with RE2's reason.
"""

from __future__ import annotations

import functools

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the caller's error, not a log line


class PatternError(ValueError):
    """A pattern RE2 cannot run; the message is RE2's reason."""


@functools.lru_cache(maxsize=4096)
def compile_pattern(pattern: str) -> re2._Regexp:
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as err:
        reason = err.args[0] if err.args else err
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise PatternError(str(reason)) from None


def search(pattern: str, name: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``name`` (``re:run`` without anchors)."""
    return compile_pattern(pattern).search(name) is not None
