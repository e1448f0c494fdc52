"""A stand-alone push consumer, run as its own process by the integration tests so that it
can be killed with SIGKILL. Appends each consumed body (a line) to OUT.

Arguments: NAMESRV GROUP TOPIC OUT RUN_S [CONSUME_FROM_WHERE (first)] [orderly|concurrently
(orderly)]."""

from __future__ import annotations

import sys
import time

import hamq

# Periods of a few seconds at most, so takeovers and lock lapses happen within a test.
FAST_ORDERLY = {
    "heartbeat_interval_s": 1.0,
    "rebalance_interval_s": 1.0,
    "lock_renew_interval_s": 1.0,
    "lock_max_live_s": 2.5,
    "persist_offset_interval_s": 0.5,
    "pull_suspend_ms": 500,
}


def main() -> None:
    namesrv, group, topic, out_path, run_s = sys.argv[1:6]
    consume_from_where, mode = sys.argv[6:8] + ["first", "orderly"][len(sys.argv[6:8]) :]
    orderly = mode == "orderly"
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 (open until the process ends)

    def listener(messages):
        for m in messages:
            out.write(m.body.decode() + "\n")
        return (
            hamq.ConsumeOrderlyStatus.SUCCESS
            if orderly
            else hamq.ConsumeConcurrentlyStatus.CONSUME_SUCCESS
        )

    consumer = hamq.PushConsumer(
        group, namesrv, consume_from_where=consume_from_where, **FAST_ORDERLY
    )
    consumer.subscribe(topic, "*")
    consumer.register_message_listener(listener, orderly=orderly)
    consumer.start()
    print("started", flush=True)
    time.sleep(float(run_s))
    consumer.shutdown()


if __name__ == "__main__":
    main()
