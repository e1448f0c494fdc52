"""A progress bar for long-running commands (benches, sync-queue): drawn with rich on stderr,
and only for a person at a terminal, so ``--json`` output and anything piped or captured
stays exactly what it was.

rich is imported only when a bar is shown; a hidden bar's ``advance`` does nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def shown(enabled: bool) -> bool:
    """A bar goes to stderr, and only when a person reads stdout: both are terminals."""
    return enabled and sys.stdout.isatty() and sys.stderr.isatty()


@contextmanager
def progress(total: int | None, description: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """Yields ``advance(n)``; ``total=None`` draws a bar without an end (elapsed time only).
    The bar is removed when the block ends, leaving the command's own output alone."""
    if not shown(enabled):
        yield _nothing
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()]
        + ([TimeRemainingColumn()] if total is not None else [])
        + [TimeElapsedColumn()]
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n: bar.advance(task, n)


def _nothing(n: int) -> None:
    """``advance`` of a bar nobody sees."""
