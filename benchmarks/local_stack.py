"""What the benchmarks that run on the local stack (snapshot.py, spark.py) share: the stack's environment, a
cdcd config for the bench publication, waiting on a running cdcd, and counting and removing a run's Kafka topics
and registry subjects."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.schema_registry import SchemaRegistryClient

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "deploy" / "local" / "stack"

# The environment for cdcd processes: the stack's CDCD_* variables would override their config files.
CDCD_ENV = {k: v for k, v in os.environ.items() if not k.startswith("CDCD_")}


def stack_env(pg_version: str = "15") -> dict[str, str]:
    """The variables ``deploy/local/stack env`` exports (DSN, Kafka, registry, Spark jars)."""
    out = subprocess.run(
        ["bash", "-c", f'eval "$(PG_VERSION={pg_version} {STACK} env)" && env -0'], check=True, capture_output=True
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def write_config(work: Path, name: str, dsn: str, slot: str, sections: dict[str, Any]) -> Path:
    """``<work>/<name>.yaml``: a cdcd config on the bench publication; ``sections`` adds or replaces sections."""
    config = {
        "source": {"dsn": dsn, "slot": slot, "publications": [{"name": "bench_pub"}]},
        "buffer": {"spill_dir": str(work / "spill")},
        "snapshot": {"state_dir": str(work / "state")},
        "metrics": {"listen": ""},
        "log": {"format": "json"},
        **sections,
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def wait_until(condition: Callable[[], Any], proc: subprocess.Popen[bytes], log: Path, interval: float) -> None:
    """Poll ``condition`` every ``interval`` s; exit with the log's tail if cdcd (``proc``) exits meanwhile."""
    while not condition():
        if proc.poll() is not None:
            raise SystemExit(f"cdcd exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(interval)


def count_messages(bootstrap: str, prefix: str) -> int:
    """Messages in the topics whose names start with ``prefix``: the sum of high - low watermarks."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4().hex[:6]}"})
    try:
        total = 0
        for name, topic in consumer.list_topics(timeout=10).topics.items():
            if name.startswith(prefix):
                for p in topic.partitions:
                    low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                    total += high - low
        return total
    finally:
        consumer.close()


def delete_topics(bootstrap: str, registry_url: str, prefix: str) -> None:
    """Remove the topics and (soft-delete) the registry subjects whose names start with ``prefix``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
    for future in admin.delete_topics(topics).values() if topics else []:
        future.result()
    registry = SchemaRegistryClient({"url": registry_url})
    for subject in registry.get_subjects():
        if subject.startswith(prefix):
            registry.delete_subject(subject, permanent=False)
