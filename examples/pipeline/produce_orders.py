"""Produce a bounded, reproducible stream of order events into the hamq topic ``orders``.

Each order is a JSON body ``{"order_id", "customer", "amount", "event_time"}`` with key =
customer and tags = ``order``. Event times are spread over a few minutes (so the job sees
several one-minute windows) and arrive slightly out of order, as real events do. The same
``--seed`` and ``--count`` give the same orders, so a test can recompute what was sent.

The stream ends with one end-of-stream marker (tags ``end-of-stream``, a body holding only
an ``event_time`` an hour after the last order): it moves the aggregation job's watermark
past every real window, so an append-mode job emits the last windows too.

    python examples/pipeline/produce_orders.py --namesrv 127.0.0.1:9876 --count 20000
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hamq.client.message import Message, MessageQueue
from hamq.client.sync import Producer

TOPIC = "orders"
ORDER_TAG = "order"
END_TAG = "end-of-stream"
# Event time of the first order: fixed, so that a run is reproducible.
BASE_TIME = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
# How far orders arrive out of event-time order; the job's watermark delay must exceed it.
MAX_LATENESS = timedelta(seconds=20)
# The marker's distance past the last order; the job's watermark delay must be below it.
END_HORIZON = timedelta(hours=1)
CUSTOMERS = [f"customer-{i:02d}" for i in range(1, 13)]
SEND_CHUNK = 1000  # orders per round of send_batch calls (one batch per queue)


@dataclass(frozen=True)
class Order:
    order_id: str
    customer: str
    amount: Decimal  # exact cents: the job's sums must equal the producer's to the cent
    event_time: datetime

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "order_id": self.order_id,
                "customer": self.customer,
                "amount": float(self.amount),
                "event_time": iso(self.event_time),
            }
        ).encode()


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def generate(count: int, seed: int = 7, minutes: int = 5) -> Iterator[Order]:
    """``count`` orders, evenly spread over ``minutes`` of event time plus jitter."""
    rng = random.Random(seed)
    span_ms = minutes * 60_000
    lateness_ms = int(MAX_LATENESS.total_seconds() * 1000)
    weights = [rng.uniform(0.5, 3.0) for _ in CUSTOMERS]  # a few customers order more
    for i in range(count):
        at_ms = i * span_ms // max(count, 1) - rng.randint(0, lateness_ms)
        yield Order(
            order_id=f"o-{seed}-{i:07d}",
            customer=rng.choices(CUSTOMERS, weights)[0],
            amount=Decimal(rng.randint(100, 50_000)) / 100,
            event_time=BASE_TIME + timedelta(milliseconds=max(at_ms, 0)),
        )


@dataclass
class Summary:
    """What was sent, for run.py and the test to compare the job's output against."""

    orders: int
    amount: Decimal
    per_customer: dict[str, tuple[int, Decimal]]

    def to_dict(self) -> dict:
        return {
            "orders": self.orders,
            "amount": str(self.amount),
            "per_customer": {c: [n, str(a)] for c, (n, a) in sorted(self.per_customer.items())},
        }


def summarize(orders: Iterator[Order]) -> Summary:
    counts: dict[str, int] = defaultdict(int)
    sums: dict[str, Decimal] = defaultdict(Decimal)
    for order in orders:
        counts[order.customer] += 1
        sums[order.customer] += order.amount
    return Summary(
        sum(counts.values()),
        sum(sums.values(), Decimal(0)),
        {c: (counts[c], sums[c]) for c in counts},
    )


def produce(
    namesrv: str, count: int, seed: int = 7, minutes: int = 5, topic: str = TOPIC
) -> Summary:
    """Send the orders (one customer's orders stay in one queue, in order), then the
    end-of-stream marker last, after every order is acknowledged."""
    orders = list(generate(count, seed, minutes))
    with Producer(namesrv, "order-producer") as producer:
        for start in range(0, len(orders), SEND_CHUNK):
            by_queue: dict[MessageQueue, list[Message]] = defaultdict(list)
            for order in orders[start : start + SEND_CHUNK]:
                queue = producer.select_queue(topic, order.customer)
                by_queue[queue].append(
                    Message(topic, order.to_json(), keys=order.customer, tags=ORDER_TAG)
                )
            for queue, messages in by_queue.items():
                producer.send_batch(messages, queue)
        last = max((o.event_time for o in orders), default=BASE_TIME)
        marker = json.dumps({"event_time": iso(last + END_HORIZON)}).encode()
        producer.send(Message(topic, marker, tags=END_TAG))
    return summarize(iter(orders))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--namesrv", default="127.0.0.1:9876")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--minutes", type=int, default=5, help="event-time span")
    args = parser.parse_args()
    print(json.dumps(produce(args.namesrv, args.count, args.seed, args.minutes).to_dict()))


if __name__ == "__main__":
    main()
