"""Helpers shared by the integration tests, as fixtures (the harness itself is
tests/conftest.py): raw-socket access to a server, draining a topic, running the CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

import hamq
from hamq.client.consumer import PullStatus
from hamq.protocol.frame import Frame, FrameDecoder

sys.path.insert(0, os.path.dirname(__file__))  # a test module may reuse another's setup

RAW_TIMEOUT_S = 5.0
CLI_TIMEOUT_S = 60.0


class RawConn:
    """A plain TCP connection speaking frames by hand (for input no client would send)."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=RAW_TIMEOUT_S)
        self.decoder = FrameDecoder()
        self.frames: list[Frame] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> Frame | None:
        """The next frame, or None if the server closed the connection first."""
        deadline = time.monotonic() + RAW_TIMEOUT_S
        while not self.frames:
            assert time.monotonic() < deadline, "no answer from the server in time"
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.frames += self.decoder.feed(data)
        return self.frames.pop(0)

    def closed_by_server(self) -> bool:
        """True once the server has closed its side (EOF or reset), within the timeout."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return True
                self.frames += self.decoder.feed(data)
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_conn():
    """``raw_conn(address)`` opens a RawConn; all are closed at the end of the test."""
    conns: list[RawConn] = []

    def open_(address: str) -> RawConn:
        conns.append(RawConn(address))
        return conns[-1]

    yield open_
    for conn in conns:
        conn.close()


@pytest.fixture
def drain_topic():
    """``drain_topic(namesrv, topic)`` -> {queue_id: [(queue_offset, body), ...]} of every
    message from each queue's minimum, following each queue until a pull finds nothing."""

    def drain(namesrv: str, topic: str, group: str = "g-drain") -> dict[int, list]:
        got: dict[int, list] = {}
        with hamq.PullConsumer(group, namesrv) as consumer:
            for mq in consumer.fetch_message_queues(topic):
                offset = consumer.min_offset(mq)
                got[mq.queue_id] = []
                while True:
                    result = consumer.pull(mq, offset, 500)
                    if result.status is not PullStatus.FOUND:
                        break
                    got[mq.queue_id] += [(m.queue_offset, m.body) for m in result.messages]
                    offset = result.next_begin_offset
        return got

    return drain


@pytest.fixture
def hamq_cli():
    """``hamq_cli(*args, input=..., timeout=...)`` runs the ``hamq`` command to completion
    and returns the CompletedProcess (text mode)."""

    def run(
        *args: str,
        input: str | None = None,  # noqa: A002 (as subprocess.run names it)
        timeout: float = CLI_TIMEOUT_S,
        env: dict | None = None,
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "hamq.cli.main", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "HAMQ_LOG_LEVEL": "WARNING", **(env or {})},
        )

    return run
