"""The disk faults' pure parts: reading the shim's log into durable sizes, the corrupt
fault on a commit log written here, and the environment a host's processes get. The real
processes under the shim are in tests/integration/test_chaos_disk_faults.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hamq.chaos.clock_faults import LIBFAKETIME
from hamq.chaos.disk_faults import (
    DiskFaults,
    NoClosedSegment,
    ShimBuildError,
    durable_sizes,
    shim_library,
)
from hamq.errors import CrcMismatch
from hamq.protocol.message import (
    MSG_HEAD_BYTES,
    check_record_payload,
    encode_batch,
    encode_message,
    encode_record_header,
    parse_record_header,
)
from hamq.store.commitlog import CommitLog

SEGMENT_BYTES = 4096


def test_durable_size_is_raised_by_fsyncs_and_lowered_by_cuts(tmp_path):
    log = tmp_path / "fsync.log"
    log.write_text(
        "1:10\t100\n"
        "1:10\t300\n"  # two fsyncs finishing out of order: the larger one was durable
        "1:10\t200\n"
        "1:11\t50\n"
        "1:11\tT20\n"  # cut: what was durable past 20 is gone
        "1:11\t10\n"
        "2:10\t7\n"  # same inode number on another device: another file
        "1:12\tT0\n"  # cut, never fsynced
        "1:13\t4"  # a line cut short (its write hit a full disk): no size to trust
    )
    assert durable_sizes(log) == {(1, 10): 300, (1, 11): 20, (2, 10): 7, (1, 12): 0}


def test_no_fsync_log_means_nothing_durable(tmp_path):
    assert durable_sizes(tmp_path / "missing") == {}


def write_log(directory: Path, records: int) -> list[Path]:
    log = CommitLog(directory, SEGMENT_BYTES)
    for i in range(records):
        payload, crc = encode_batch([encode_message(b"%d" % i * 40), encode_message(b"")])
        header = encode_record_header(b"T", 0, len(payload), crc, 2, i * 2, 0, 1, 1)
        phys = log.reserve(len(header) + len(payload))
        header = encode_record_header(b"T", 0, len(payload), crc, 2, i * 2, phys, 1, 1)
        log.append([header, payload], len(header) + len(payload))
    log.close()
    return sorted(directory.iterdir())


def test_corrupt_flips_one_body_byte_of_a_closed_segment(tmp_path):
    segments = write_log(tmp_path / "store" / "commitlog", 60)
    assert len(segments) >= 3
    before = [p.read_bytes() for p in segments]
    where = DiskFaults(tmp_path / "run").corrupt(tmp_path / "store", random.Random(1))
    name, _, offset = where.rpartition("@")
    changed = [
        (path, i)
        for path, old in zip(segments, before)
        for i, (a, b) in enumerate(zip(old, path.read_bytes()))
        if a != b
    ]
    assert changed == [(Path(name), int(offset))]
    assert Path(name) != segments[-1]
    data, at = Path(name).read_bytes(), int(offset)
    pos = 0
    while True:  # the record holding the byte: its header holds, its payload CRC fails
        header = parse_record_header(data, pos)
        if at < pos + header.total_size:
            break
        pos += header.total_size
    assert at >= pos + header.payload_start + MSG_HEAD_BYTES  # past the message's head
    with pytest.raises(CrcMismatch, match="payload CRC"):
        check_record_payload(data, pos, header)


def test_corrupt_finds_the_logs_of_a_mirrored_node(tmp_path):
    """A node holds one store per group: ``<store_dir>/<group>/commitlog``."""
    write_log(tmp_path / "node" / "g1" / "commitlog", 3)  # no closed segment
    segments = write_log(tmp_path / "node" / "g2" / "commitlog", 60)
    where = DiskFaults(tmp_path / "run").corrupt(tmp_path / "node", random.Random(5))
    assert Path(where.rpartition("@")[0]) in segments[:-1]


def test_corrupt_refuses_a_store_without_a_closed_segment(tmp_path):
    disks = DiskFaults(tmp_path / "run")
    with pytest.raises(NoClosedSegment, match="commit logs: none"):
        disks.corrupt(tmp_path / "nothing", random.Random(1))
    write_log(tmp_path / "store" / "commitlog", 3)  # one segment, still the newest
    with pytest.raises(NoClosedSegment):
        disks.corrupt(tmp_path / "store", random.Random(1))


def test_env_preloads_the_shim_and_libfaketime_together(tmp_path):
    disks = DiskFaults(tmp_path / "run")
    env = disks.env("h1", shim=True, clock=True)
    assert env["LD_PRELOAD"] == f"{shim_library()} {LIBFAKETIME}"
    assert env["HAMQ_SHIM_DIR"] == str(tmp_path / "run" / "hosts" / "h1" / "shim")
    assert Path(env["FAKETIME_TIMESTAMP_FILE"]).read_text() == "+0s\n"
    assert env["FAKETIME_NO_CACHE"] == env["FAKETIME_DONT_FAKE_MONOTONIC"] == "1"
    assert disks.env("h1", shim=False) == {}
    clock_only = disks.env("h1", shim=False, clock=True)
    assert clock_only["LD_PRELOAD"] == env["LD_PRELOAD"]  # the shim, inert: its sleep fix
    assert "HAMQ_SHIM_DIR" not in clock_only
    assert "FAKETIME_TIMESTAMP_FILE" not in disks.env("h1")


def test_bad_requests_are_refused(tmp_path):
    disks = DiskFaults(tmp_path / "run")
    with pytest.raises(ValueError, match="no tmpfs"):
        disks.fill("h1")  # never the real disk
    with pytest.raises(ValueError, match=">= 0 ms"):
        disks.slow_disk("h1", -1)
    with pytest.raises(ValueError, match="positive size"):
        disks.data_dir("h1", tmpfs_mib=0)
    (disks.data_dir("h1") / "segment").write_bytes(b"kept")
    with pytest.raises(FileNotFoundError, match="did not run under the fsync shim"):
        disks.power_loss(disks.host_dir("h1"))
    assert (disks.data_dir("h1") / "segment").read_bytes() == b"kept"


def test_each_corruption_damages_another_record(tmp_path):
    segments = write_log(tmp_path / "store" / "commitlog", 60)
    disks, rng = DiskFaults(tmp_path / "run"), random.Random(3)
    hits = {disks.corrupt(tmp_path / "store", rng) for _ in range(20)}
    damaged = 0
    for path in segments[:-1]:
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            header = parse_record_header(data, pos)
            try:
                check_record_payload(data, pos, header)
            except CrcMismatch:
                damaged += 1
            pos += header.total_size
    assert len(hits) == damaged == 20


def test_shim_is_built_once_per_source_and_needs_a_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "no-such-cc")
    with pytest.raises(ShimBuildError, match="no C compiler"):
        shim_library()
    monkeypatch.setenv("CC", "cc")
    built = shim_library()
    assert built.parent == tmp_path / "cache" / "hamq" and built.stat().st_size > 0
    assert list(built.parent.iterdir()) == [built]  # no temporary left behind
    monkeypatch.setenv("CC", "no-such-cc")
    assert shim_library() == built  # cached: no compiler needed again
