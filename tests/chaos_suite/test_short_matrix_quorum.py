"""The short chaos matrix, second half (see test_short_matrix.py): the controller and
mirrored modes under kill -9 and partitions."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class TestController:
    @pytest.mark.parametrize("nemesis", ["kill", "partition"])
    def test_promise_kept(self, nemesis, promised_run):
        promised_run("controller", nemesis)


class TestMirrored:
    @pytest.mark.parametrize("nemesis", ["kill", "partition"])
    def test_promise_kept(self, nemesis, promised_run):
        promised_run("mirrored", nemesis)
