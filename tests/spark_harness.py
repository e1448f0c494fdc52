"""Spark test support: the session settings, and ``spark/stream_job.py`` run in its own
process group, killed (by that group's id) when a test is done with it or wants it dead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hamq.spark.failpoint import FAILPOINT_ENV

JOB = Path(__file__).parent / "spark" / "stream_job.py"
JOB_TIMEOUT_S = 180

SPARK_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
}


def spark_env() -> dict[str, str]:
    """Workers must run the venv's interpreter (it has hamq and pyarrow) and bind to
    loopback."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


class StreamJob:
    """``failpoint`` ("<stage>:<batch id>:<marker file>") arms the sink's test hook in the
    driver's environment (``hamq.spark.writer.Failpoint``)."""

    def __init__(self, log: Path, failpoint: str | None = None, **spec) -> None:
        spec.setdefault("conf", SPARK_CONF)
        self.log = log
        env = {**os.environ, **spark_env()}
        if failpoint is not None:
            env[FAILPOINT_ENV] = failpoint
        self.proc = subprocess.Popen(
            [sys.executable, str(JOB), json.dumps(spec)],
            stdout=open(log, "ab"),  # noqa: SIM115 (the child holds it)
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    def wait(self, timeout_s: float = JOB_TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.kill9()

    def wait_until(self, condition, timeout_s: float = JOB_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"stream job exited early ({self.proc.returncode}); log:\n"
                    + self.log.read_text()[-4000:]
                )
            if time.monotonic() > deadline:
                self.kill9()
                raise AssertionError(
                    "stream job did not get there in time; log:\n" + self.log.read_text()[-4000:]
                )
            time.sleep(0.2)

    def kill9(self) -> None:
        """SIGKILL the driver, its JVM and its Python workers: the whole process group."""
        if self.proc.poll() is None or _group_alive(self.proc.pid):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
