"""The bounded chaos matrix of ``make test``: every mode under kill -9, and the fault that
matters most for each (a partition for the quorum modes, a hung master for master-slave, a
power loss for the single fsyncing broker), a few seconds each, on real processes in
network namespaces. The modes are split over two modules (this one and
test_short_matrix_quorum.py, about the same time each) so that pytest-xdist, which keeps a
module on one worker, runs them side by side. The long matrix is ``make chaos``
(docs/RELIABILITY.md)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


class TestSingle:
    @pytest.mark.parametrize("nemesis", ["kill", "power-loss"])
    def test_promise_kept(self, nemesis, promised_run):
        promised_run("single", nemesis)


class TestMasterSlave:
    @pytest.mark.parametrize("nemesis", ["kill", "pause"])
    def test_promise_kept(self, nemesis, promised_run):
        promised_run("master-slave", nemesis)


class TestDledger:
    @pytest.mark.parametrize("nemesis", ["kill", "partition"])
    def test_promise_kept(self, nemesis, promised_run):
        promised_run("dledger", nemesis)
