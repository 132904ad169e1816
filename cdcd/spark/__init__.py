"""Mirror tables from cdcd's Kafka topics with PySpark Structured Streaming (the ``cdcd[spark]`` extra).

``python -m cdcd.spark --help`` (or spark-submit of that module's file) runs the job; :func:`session`,
:class:`Options` and :func:`start` are the same job as functions. The pure parts (wire format, schemas, the
MERGE) live in :mod:`cdcd.spark.wire`, :mod:`cdcd.spark.schema` and :mod:`cdcd.spark.merge` and import no
Spark. docs/spark.md has the guarantees and limits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cdcd.spark.job import Options, session, start

__all__ = ["Options", "session", "start"]


def __getattr__(name: str) -> Any:  # pyspark is imported only when the Spark side is used
    if name in __all__:
        from cdcd.spark import job  # noqa: PLC0415

        return getattr(job, name)
    raise AttributeError(name)
