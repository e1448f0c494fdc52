"""The chaos final read over a queue holding a record the broker refuses for good (a single
broker's damaged record: no intact copy anywhere) reads every other record of the queue and
puts an unparseable body at the damaged offset (the checker: one phantom there). It used to
drop the whole queue — every message of it "lost" and, once consumed, "phantom": 214 of
each for one flipped byte (hamq chaos run --mode single --nemesis corrupt --seed 1)."""

from __future__ import annotations

import json

from test_corrupt_segment import MESSAGES, SEGMENT_BYTES, TOPIC, flip_body_byte, send_all

from hamq.chaos.workload import final_read

# Before the fix the read of the queue never completed: it gave up at this deadline.
FINAL_READ_TIMEOUT_S = 15


def test_final_read_steps_over_a_refused_record(cluster_factory, tmp_path):
    c = cluster_factory()
    c.start_namesrv()
    c.start_broker(flush_disk_type="sync", mapped_file_size_commitlog=SEGMENT_BYTES)
    send_all(c.namesrv)
    damaged = flip_body_byte(c.root / "broker")
    path = tmp_path / "final.jsonl"
    final_read(c.namesrv, [TOPIC], path, FINAL_READ_TIMEOUT_S)
    reads = [json.loads(line) for line in path.read_text().splitlines()]
    # every offset, the refused one included (as an invalid read), none dropped
    assert [r["offset"] for r in reads] == list(range(MESSAGES))
    assert 0 < damaged < MESSAGES - 1 and not reads[damaged]["valid"]
