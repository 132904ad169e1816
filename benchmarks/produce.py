"""What producing costs from Python, with nothing left to encode: N pre-encoded messages through confluent-kafka
with cdcd's producer settings (idempotent, acks=all, lz4, linger 5 ms, 100,000-message queue), with a delivery
report callback per message (what cdcd's at-least-once sink does: each one acknowledges a transaction's record),
with a callback per message that is a C function (``dict.__setitem__``: the least a compiled acknowledgement
counter could cost), with reports of failures only (``delivery.report.only.error``: how the sink produces a
transaction of ``kafka.whole_transaction_changes`` or more, acknowledged whole) and without one (what its
exactly-once sink does: the Kafka transaction's commit fails if a message failed); and the per-message and
failures-only calls again with positional arguments only (``produce(topic, value, key, -1, callback)``, as cdcd
calls it: confluent-kafka parses keyword arguments at a cost per call; the other variants pass ``on_delivery=``).

The floor under cdcd's time after a large transaction commits: replaying and encoding can be made faster, but
these messages are produced and acknowledged after the commit in any design that sends committed changes only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

PRODUCER = {
    "linger.ms": 5,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 100_000,
    "queue.buffering.max.kbytes": 65_536,
    "enable.idempotence": True,
    "acks": "all",
}


VARIANTS = (
    "per-message callback",
    "C callback",
    "failures only",
    "no callback",
    "per-message, positional",
    "failures, positional",
)


def run(bootstrap: str, messages: int, value_bytes: int, variant: str) -> tuple[float, float]:
    """Produce ``messages`` to a new one-partition topic until all are acknowledged; (seconds, CPU seconds)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"bench_produce_{os.getpid()}_{time.monotonic_ns()}"
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    failures: list[KafkaError] = []
    only_errors = {"delivery.report.only.error": True, "on_delivery": lambda e, m: failures.append(e)}
    producer = Producer(
        {"bootstrap.servers": bootstrap, **PRODUCER, **(only_errors if variant.startswith("failures") else {})}
    )
    key, value = b"\0\0\0\0\1" + b"k" * 8, b"\0\0\0\0\2" + b"v" * (value_bytes - 5)
    acked = [0]

    def on_delivery(error: KafkaError | None, message: Message) -> None:
        if error is None:
            acked[0] += 1

    reports: dict[KafkaError | None, Message] = {}  # the C callback's: the last report per outcome
    produce: Callable[..., Any] = producer.produce
    callback = {
        "per-message callback": on_delivery,
        "C callback": reports.__setitem__,
        "per-message, positional": on_delivery,
    }.get(variant)
    extra = {"on_delivery": callback}  # None too: as cdcd called it until the positional calls
    positional = variant.endswith("positional")
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(messages):
        while True:
            try:
                if positional:
                    produce(topic, value, key, -1, callback)  # -1: the partitioner chooses
                else:
                    produce(topic, value, key, **extra)
                break
            except BufferError:  # the queue is full: serve acknowledgements, as cdcd does
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise SystemExit(f"{topic}: not every message was acknowledged within 120 s")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if callback is on_delivery and acked[0] != messages:
        raise SystemExit(f"{topic}: {acked[0]} of {messages} acknowledged")
    if callback is not None and callback is not on_delivery and list(reports) != [None]:
        raise SystemExit(f"{topic}: a delivery failed: {reports}")
    if failures:
        raise SystemExit(f"{topic}: {len(failures)} deliveries failed: {failures[0]}")
    admin.delete_topics([topic])
    return seconds, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per run (default 1000000)")
    parser.add_argument("--value-bytes", type=int, default=100, help="value size (default 100, header included)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per variant, alternating (default 2)")
    parser.add_argument(
        "--bootstrap-servers", default=os.environ.get("CDCD_KAFKA__BOOTSTRAP_SERVERS", "127.0.0.1:19092")
    )
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeat):
        for name, runs in results.items():
            runs.append(run(args.bootstrap_servers, args.messages, args.value_bytes, name))
    print(f"{args.messages:,} messages of {args.value_bytes} B (key 13 B), one partition, cdcd's producer settings")
    print(f"{'variant':<24} {'best s':>8} {'median s':>9} {'msgs/s':>11} {'CPU µs/msg':>11}")
    for name, runs in results.items():
        best = min(runs)
        median = statistics.median(s for s, _ in runs)
        rate = args.messages / best[0]
        print(f"{name:<24} {best[0]:>8.2f} {median:>9.2f} {rate:>11,.0f} {best[1] / args.messages * 1e6:>11.2f}")


if __name__ == "__main__":
    main()
