"""A test hook of the sink's commit: at a stage of committing one micro-batch, stop (so a
test can kill the driver exactly between the sink's steps) or fail (as a lost answer
would), so the real abort and replay paths run."""

from __future__ import annotations

import os
import time

from hamq.errors import RequestTimeout

FAILPOINT_ENV = "HAMQ_TEST_FAILPOINT"
HOLD_POLL_S = 0.1


class Failpoint:
    """Armed only by the driver's environment (``HAMQ_TEST_FAILPOINT="<stage>:<batch
    id>:<marker file>"``), which the test harness sets; no query option reaches it, so no
    user can stop a driver with it. Stages: ``before_journal``, ``after_journal``,
    ``after_commit``. Reaching its stage, the commit appends a line to the marker file and
    holds while the file exists (a crash test kills it there; an in-process test releases
    it by removing the file). ``<stage>+raise`` raises ``RequestTimeout`` instead of
    holding, as when the broker's answer to that step was lost."""

    def __init__(self, spec: str | None) -> None:
        self.stage, self.raises, self.batch_id, self.marker = (None, False, -1, "")
        if spec:
            stage, batch_id, marker = spec.split(":", 2)
            stage, plus, action = stage.partition("+")
            self.stage, self.raises = stage, plus == "+" and action == "raise"
            self.batch_id, self.marker = int(batch_id), marker

    @classmethod
    def from_environment(cls) -> Failpoint:
        return cls(os.environ.get(FAILPOINT_ENV))

    def reached(self, stage: str, batch_id: int) -> None:
        if stage != self.stage or batch_id != self.batch_id:
            return
        with open(self.marker, "a") as f:
            f.write(f"{stage}:{batch_id}:{os.getpid()}\n")
        if self.raises:
            raise RequestTimeout(f"test failpoint: the answer after {stage} was lost")
        while os.path.exists(self.marker):
            time.sleep(HOLD_POLL_S)
