"""One broker's traffic by topic and consumer group, and its send and end-to-end latency.

The hot path touches these once per send request and once per pull or pop answer (never
per message; the latency of sends answered at once is observed once per read), and only
with plain integer adds and one ``bisect`` per histogram observation: a prometheus_client
``Counter`` or ``Histogram`` takes a lock on each update, which ``net/metrics.py``
measured at a quarter of the single-message send rate.
They become Prometheus counters and histograms when scraped (``export``) and the
``stats`` of GET_BROKER_RUNTIME_INFO (``runtime_info``), which the web console's
history turns into rates.
"""

from __future__ import annotations

import struct
from bisect import bisect_left

from hamq.errors import HamqError
from hamq.net.counts import LATENCY_US_BOUNDS, Histogram
from hamq.net.metrics import Families
from hamq.protocol.message import HEADER_CRC_FROM, validate_name

# A record's store timestamp: after magic and header CRC come total size, payload CRC,
# physical offset and base queue offset (``protocol/message.py``'s record layout).
_unpack_store_timestamp = struct.Struct(">q").unpack_from
_STORE_TIMESTAMP_AT = HEADER_CRC_FROM + struct.calcsize(">IIQQ")

# Upper bounds of the end-to-end histogram's buckets (ms: store times are in ms).
END_TO_END_MS_BOUNDS = (
    1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
    300_000, 3_600_000,
)  # fmt: skip

# Consumer groups are named by clients: past this many (group, topic) rows a broker counts
# the traffic of new ones only in its topics' totals, so a client inventing group names
# cannot grow memory or the series a scrape returns without end.
MAX_GROUP_ROWS = 1_000
# Topic series a scrape returns per broker (four per topic): past it the rest are summed
# into one series labelled OTHER_TOPICS (no topic name can be that: RocketMQ's charset has
# no parentheses), so totals stay right and a table of 10,000 topics is not 40,000 series.
# Topics keep their rows in order of first traffic, so the same ones are folded each scrape
# and the folded counters still only go up.
MAX_TOPIC_SERIES = 1_000
OTHER_TOPICS = "(other)"

_MESSAGES_IN, _BYTES_IN, _MESSAGES_OUT, _BYTES_OUT = range(4)


class BrokerStats:
    """Counters since the broker started: ``topics[topic]`` = [messages in, bytes in,
    messages out, bytes out], ``groups[(group, topic)]`` = [messages out, bytes out]."""

    def __init__(self) -> None:
        self.topics: dict[str, list[int]] = {}
        self.groups: dict[tuple[str, str], list[int]] = {}
        self.groups_dropped = 0  # answers to (group, topic) rows past MAX_GROUP_ROWS
        self.send_latency_us = Histogram(LATENCY_US_BOUNDS)
        self.end_to_end_ms = Histogram(END_TO_END_MS_BOUNDS)

    def produced(self, topic: str, messages: int, nbytes: int) -> None:
        row = self.topics.get(topic) or self._topic_row(topic)
        row[_MESSAGES_IN] += messages
        row[_BYTES_IN] += nbytes

    def consumed(
        self,
        group: object,
        topic: str,
        messages: int,
        records: bytes | bytearray | memoryview,
        now_ms: int,
    ) -> None:
        """An answer handed out ``messages`` in ``records``: the end-to-end latency is its
        first message's (from its store time to ``now_ms``, wall clock both). Written for
        the pull path's sake: no call it can do without."""
        nbytes = len(records)
        row = self.topics.get(topic) or self._topic_row(topic)
        row[_MESSAGES_OUT] += messages
        row[_BYTES_OUT] += nbytes
        waited = now_ms - _unpack_store_timestamp(records, _STORE_TIMESTAMP_AT)[0]
        if waited < 0:  # the wall clock stepped back since it was stored
            waited = 0
        e2e = self.end_to_end_ms
        e2e.counts[bisect_left(e2e.bounds, waited)] += 1
        e2e.total += waited
        try:  # free unless it raises (Python 3.11): cheaper than checking the type first
            by_group = self.groups.get((group, topic))  # type: ignore[arg-type]
        except TypeError:  # a group that is no name and not even hashable (a list)
            return
        if by_group is None:
            by_group = self._group_row(group, topic)
            if by_group is None:
                return
        by_group[0] += messages
        by_group[1] += nbytes

    def _topic_row(self, topic: str) -> list[int]:
        row = self.topics[topic] = [0, 0, 0, 0]
        return row

    def _group_row(self, group: object, topic: str) -> list[int] | None:
        if not isinstance(group, str):  # a pull without a group (a tool reading a queue)
            return None
        try:  # pulls do not check their group; a row is kept for ever, in every scrape
            validate_name(group, "group")
        except HamqError:  # a name no offset can be committed under (60 KB, quotes): no row
            return None
        if len(self.groups) >= MAX_GROUP_ROWS:
            self.groups_dropped += 1
            return None
        row = self.groups[(group, topic)] = [0, 0]
        return row

    def runtime_info(self) -> dict:
        """GET_BROKER_RUNTIME_INFO's ``stats``: {"topics": {topic: {messages_in, bytes_in,
        messages_out, bytes_out}}, "groups": {group: {topic: {messages_out, bytes_out}}}}."""
        groups: dict[str, dict[str, dict[str, int]]] = {}
        for (group, topic), (messages, nbytes) in list(self.groups.items()):
            groups.setdefault(group, {})[topic] = {"messages_out": messages, "bytes_out": nbytes}
        return {
            "topics": {
                topic: dict(zip(("messages_in", "bytes_in", "messages_out", "bytes_out"), row))
                for topic, row in list(self.topics.items())
            },
            "groups": groups,
        }

    def export(self, families: Families, labels: dict[str, str]) -> None:
        """The counters and histograms as Prometheus series (a scrape, in its thread:
        copies, as the event loop adds rows meanwhile)."""
        rows = list(self.topics.items())
        dropped = max(0, len(rows) - MAX_TOPIC_SERIES)
        if dropped:
            folded = [sum(column) for column in zip(*(row for _, row in rows[MAX_TOPIC_SERIES:]))]
            rows[MAX_TOPIC_SERIES:] = [(OTHER_TOPICS, folded)]
        families.gauge(
            "hamq_topic_series_dropped",
            f"Topics past the first {MAX_TOPIC_SERIES}, counted in the topic {OTHER_TOPICS!r}",
            labels,
            dropped,
        )
        for topic, row in rows:
            at = {**labels, "topic": topic}
            families.counter(
                "hamq_topic_messages_in", "Messages stored by sends", at, row[_MESSAGES_IN]
            )
            families.counter("hamq_topic_bytes_in", "Bytes stored by sends", at, row[_BYTES_IN])
            families.counter(
                "hamq_topic_messages_out",
                "Messages handed out by pulls and pops",
                at,
                row[_MESSAGES_OUT],
            )
            families.counter(
                "hamq_topic_bytes_out", "Bytes handed out by pulls and pops", at, row[_BYTES_OUT]
            )
        for (group, topic), (messages, nbytes) in list(self.groups.items()):
            at = {**labels, "group": group, "topic": topic}
            families.counter(
                "hamq_group_messages_out", "Messages handed out to a consumer group", at, messages
            )
            families.counter(
                "hamq_group_bytes_out", "Bytes handed out to a consumer group", at, nbytes
            )
        families.counter(
            "hamq_group_rows_dropped",
            f"Answers to consumer groups past the first {MAX_GROUP_ROWS} (group, topic) rows "
            "(counted in their topics only)",
            labels,
            self.groups_dropped,
        )
        for name, documentation, histogram, per_unit in (
            (
                "hamq_send_latency_seconds",
                "Send requests: arrival to answer (its wait for flush and slave acks included)",
                self.send_latency_us,
                1_000_000,
            ),
            (
                "hamq_end_to_end_latency_seconds",
                "Pull and pop answers: store time of the first message to its hand-out",
                self.end_to_end_ms,
                1_000,
            ),
        ):
            families.histogram(name, documentation, labels, histogram, per_unit)
