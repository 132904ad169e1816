"""Exactly-once delivery (``kafka.delivery: exactly_once``), the delivery strategy a ``KafkaSink`` holds instead
of ``AtLeastOnceDelivery`` (``sink/delivery.py``): the records in Kafka transactions, each also writing the WAL
position it covers to the progress topic (``sink.progress_topic``).

A Kafka transaction holds whole PostgreSQL transactions (one or more: it is committed once
``commit_interval_ms`` passed since its first was written or ``max_messages`` were written, at a PostgreSQL
transaction's end), snapshot batches and messages, then the progress record: the data and the position commit
atomically. Nothing in it is confirmed to PostgreSQL (``Ledger``) before the commit succeeded.

A commit is a few round trips to the broker (the last records and the progress record acknowledged, EndTxn), and
confluent-kafka lets no record be produced meanwhile. Its first attempt runs on the sink's committer thread
(``_Commit``; one thread, made once: on a loaded machine a new thread per commit waited to be scheduled; the client
lets go of the GIL while it waits) so that the loop goes on reading, decoding and shaping: what it shapes
meanwhile waits in a buffer, produced in the next Kafka transaction once the commit is through. A change that
arrives during a commit then waits for that commit and one interval at most, not for both plus the next commit
(benchmarks/README.md, "Exactly-once latency"). Everything after that first attempt (retries, aborts, rewinds)
is done on the loop's thread, as before.

At the start of each session ``committed`` fences any earlier writer with the same ``transactional.id``
(aborting its open transaction) and reads the last committed record: stream records at or below its position
are not written again, however far back the slot's confirmed position is. An abortable error aborts the Kafka
transaction and raises ``SinkRewind``: the loop reconnects and starts again from the committed position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import structlog
from confluent_kafka import KafkaError, KafkaException

from cdcd.batches import Plain, Transaction
from cdcd.config import KafkaSettings
from cdcd.ledger import Entry, Ledger
from cdcd.lsn import format_lsn
from cdcd.shaping import Emit, EmitMany, Headers
from cdcd.sink import Committed, SessionContext, SinkFailure, SinkRewind
from cdcd.sink import progress_topic as records
from cdcd.sink.clients import log_wait
from cdcd.sink.registry import KafkaRegistry
from cdcd.sink.transport import KafkaTransport, Shape

log = structlog.get_logger("cdcd.sink.kafka")

_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
_READ_TIMEOUT_S = 10.0  # per request to Kafka while reading the progress topic; then it is tried again
_READ_RETRY_PAUSE_S = 1.0  # between reads of the progress topic: some errors (no leader yet) come back at once
_ABORT_TIMEOUT_S = 5.0  # an abort at a session's end waits this long for Kafka, then is left for the next session
_COMMIT_TIMEOUT_S = 1.0  # per attempt to commit; a retriable failure is tried again (with status updates meanwhile)
# While a commit runs in its thread the loop looks for its end this often (it reads the walsender meanwhile).
COMMIT_POLL_S = 0.001


def _not_started(topic: str, key: bytes | None, value: bytes | None, headers: Headers | None) -> None:
    raise RuntimeError("the exactly-once sink writes only once its session started (Sink.committed)")


def _not_started_many(records: list[Plain]) -> None:
    _not_started("", None, None, None)


Buffered = tuple[str, bytes | None, bytes | None, Headers | None] | list[Plain]  # one record, or a run of them


class _Commit:
    """The commit of a Kafka transaction, its first attempt on the committer's thread, and what it holds."""

    def __init__(
        self, committer: ThreadPoolExecutor, call: Callable[[], None], held: list[Entry], c: Committed
    ) -> None:
        self.held, self.committed = held, c
        self._call = call
        self._first = committer.submit(call)  # a thread that is there already: nothing waits for one to start
        self._tried = self._retried = False

    @property
    def running(self) -> bool:
        return not self._first.done()

    @property
    def succeeded(self) -> bool:
        return self._retried or (self._first.done() and self._first.exception() is None)

    def wait(self) -> None:
        futures.wait([self._first])

    def failure(self) -> str:
        failure = self._first.exception()
        return failure.args[0].str() if isinstance(failure, KafkaException) else repr(failure)

    def again(self) -> None:
        """The commit once more (``_retrying``'s call), on the loop's thread: the first time, the thread's outcome."""
        if not self._tried:
            self._tried = True
            self._first.result()  # raises what the first attempt raised
            return
        self._call()
        self._retried = True


class ExactlyOnceDelivery:
    transactional = True

    def __init__(self, kafka: KafkaSettings, transport: KafkaTransport, topics: KafkaRegistry) -> None:
        self.settings = kafka
        self.transport, self.topics = transport, topics
        transport.explain = self._explain
        self.options = kafka.exactly_once
        self.progress_topic = kafka.progress_topic
        self.transactional_id = ""
        self.slot = self.system_id = ""
        self.snapshot_state: Callable[[], dict[str, Any] | None] = lambda: None
        self.snapshot_committed: Callable[[], None] = lambda: None
        self.kafka_transactions = 0  # committed
        self._open_at: float | None = None  # monotonic time the first entry of _held was written (None: none held)
        self._opened_with = 0  # self.produced when it began
        self._held: list[Entry] = []  # entries written in the open Kafka transaction (or buffered), in order
        self._begun = False  # the Kafka transaction of _held has begun (else its records wait in _buffer)
        self._whole = True  # False while the buffer is being produced: an interruption leaves a part of it
        self._buffer: list[Buffered] = []  # records shaped while a commit runs, in order
        self._buffered = 0  # records in _buffer
        self._commit_run: _Commit | None = None  # a commit begun and not yet known to have succeeded
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="cdcd-kafka-commit")  # its thread made at first use
        self._progress: Ledger | None = None
        self._abort_pending = False  # an abort at a session's end did not go through: done before anything else
        self._position = -1  # start LSN of the last stream record written
        self._committed = Committed(0, -1, None)
        self._emit: Emit = _not_started
        self._emit_many: EmitMany = _not_started_many

    # -- the session's start ----------------------------------------------------------------------

    def committed(self, slot: str, system_id: str, slot_created: bool) -> Committed | None:
        if not self.transport.started:  # made now: its transactional.id needs the database system id
            self._make_transactional(slot, system_id)
        # What the last session left open is aborted, never committed: it comes from a connection that is gone,
        # perhaps to a server since demoted (the promotion check comes after this); the server sends it again.
        self._abort_open("a new replication session starts")
        if self._abort_pending:
            self._retrying("abort a Kafka transaction", lambda: self.transport.producer.abort_transaction(1.0))
            self._abort_pending = False
        self.slot, self.system_id = slot, system_id
        found = self._read_progress(slot)
        self._committed, self._position = Committed(0, -1, None), -1
        if isinstance(found, records.Missing):
            self._progress_topic_missing(slot_created)
            return None
        if slot_created:
            if found is not None:
                log.info("the slot was created now: the progress topic's older record is not used", slot=slot)
            return None
        if found is None:
            log.warning(
                "no committed position in the progress topic: starting at the slot's confirmed position. What an"
                " earlier at-least-once run sent after it is sent again, once",
                topic=self.progress_topic,
                slot=slot,
            )
            return None
        committed = self._committed = records.decode(found, slot, system_id, self.progress_topic)
        self._position = committed.position
        log.info(
            "resuming after the last committed Kafka transaction",
            flush_lsn=format_lsn(committed.flush_lsn),
            position=format_lsn(max(committed.position, 0)),
            transactional_id=self.transactional_id,
        )
        return committed

    def _read_progress(self, slot: str) -> bytes | records.Missing | None:
        """The progress topic's last record for ``slot``, waiting for Kafka while it does not answer (a rewind or
        reconnection can come while the broker restarts): only a definite error stops."""
        logged_at: float | None = None
        while True:
            try:
                return records.read_last(self.settings.client_config(), self.progress_topic, slot, _READ_TIMEOUT_S)
            except records.ProgressTopicUnreachable as exc:
                self.transport.raise_failure()
                logged_at = log_wait("Kafka", "read the progress topic", str(exc), logged_at)
                self.transport.keep_alive()
                time.sleep(_READ_RETRY_PAUSE_S)  # not a new consumer per millisecond

    def _make_transactional(self, slot: str, system_id: str) -> None:
        self.transactional_id = self.options.transactional_id or f"cdcd-{system_id}-{slot}"
        timeout_ms = self.options.transaction_timeout_s * 1000
        producer = self.transport.start(
            {
                "transactional.id": self.transactional_id,
                "transaction.timeout.ms": timeout_ms,
                "message.timeout.ms": timeout_ms,  # librdkafka: at most the transaction's timeout
            }
        )
        self._retrying("initialize Kafka transactions", lambda: producer.init_transactions(1.0))
        self._emit = self.transport.producing(None, None)  # no delivery reports: the commit fails if one failed
        self._emit_many = self.transport.producing_many(None, None)

    def _progress_topic_missing(self, slot_created: bool) -> None:
        topic = self.progress_topic
        if not slot_created:
            raise records.ProgressTopicError(
                f"progress topic {topic} does not exist, but slot {self.slot} does: what was committed is unknown."
                " If exactly-once delivery is new for this slot, create the topic (compacted, one partition) and"
                " start again; cdcd then starts at the slot's confirmed position"
            )
        if not self.settings.create_topics:
            raise records.ProgressTopicError(
                f"progress topic {topic} does not exist and kafka.create_topics is off: create it (cleanup.policy="
                "compact, one partition)"
            )
        self.topics.create_topic(topic, 1, {"cleanup.policy": "compact", "segment.ms": "3600000"})

    def start_session(self, session: SessionContext) -> None:
        self.snapshot_state = session.snapshot_state
        self.snapshot_committed = session.snapshot_committed

    def already_written(self) -> int:
        return self._committed.position

    # -- writing ----------------------------------------------------------------------------------

    def write(
        self, progress: Ledger, entry: Entry, shape: Shape, position: int | None, txn: Transaction | None
    ) -> None:
        """In the open Kafka transaction (one is begun if none is), finished when it commits; while a commit
        runs, shaped into the buffer for the next one."""
        self._hold(entry, progress)
        if self._begun:
            shape(self._emit, self._emit_many)
        else:
            shape(self._buffer_one, self._buffer_many)
        if position is not None:
            self._position = position
        progress.seal(entry)
        self._commit_if_due()

    def _hold(self, entry: Entry, progress: Ledger) -> None:
        """``entry`` is finished when the Kafka transaction it is written in commits; open one if none is (unless
        a commit runs: then its records wait)."""
        assert not self._abort_pending, "an interrupted Kafka transaction is aborted before anything is written"
        self._commit_finished()
        if not self._begun and self._commit_run is None:
            self._begin()
        if self._open_at is None:
            self._open_at = time.monotonic()
        self._progress = progress
        entry.outstanding += 1
        self._held.append(entry)

    def _begin(self) -> None:
        """Begin the Kafka transaction of what is held, and produce what waited in the buffer."""
        self._retrying("begin a Kafka transaction", self.transport.producer.begin_transaction)
        self._begun, self._opened_with = True, self.transport.produced
        # librdkafka adds a partition to the transaction (a round trip to the coordinator) before its first record:
        # the progress topic's is added now, beside the data's, not inside the commit. The record of the last commit
        # (the commit's own record supersedes it; an abort drops both).
        key, value = records.encode(self.slot, self.system_id, self._committed)
        self._emit(self.progress_topic, key, value, None)
        buffer, self._buffer, self._buffered = self._buffer, [], 0
        emit, emit_many = self._emit, self._emit_many
        self._whole = False  # until all of the buffer is produced (a wait for room can be interrupted)
        for item in buffer:
            if isinstance(item, list):
                emit_many(item)
            else:
                emit(*item)
        self._whole = True

    def _buffer_one(self, topic: str, key: bytes | None, value: bytes | None, headers: Headers | None) -> None:
        self._buffer.append((topic, key, value, headers))
        self._buffered += 1

    def _buffer_many(self, records: list[Plain]) -> None:
        self._buffer.append(records)
        self._buffered += len(records)

    # -- committing -------------------------------------------------------------------------------

    def wake_in(self) -> float:
        if self._commit_run is not None:
            return COMMIT_POLL_S
        if self._open_at is None:
            return self.transport.wake_in()
        return max(0.0, self._open_at + self.options.commit_interval_ms / 1000 - time.monotonic())

    def poll(self) -> None:
        self._commit_finished()
        if self._open_at is not None and self._commit_run is None and self.wake_in() == 0:
            self._commit()

    def flush(self) -> None:
        self._commit_finished(wait=True)
        if self._open_at is not None:
            self._commit()
            self._commit_finished(wait=True)

    def _commit_if_due(self) -> None:
        assert self._open_at is not None
        if self._buffered >= self.options.max_messages:  # a commit runs and the buffer is full: wait for it
            self._commit_finished(wait=True)
        if self._commit_run is not None:
            return
        if (
            self.transport.produced - self._opened_with >= self.options.max_messages
            or time.monotonic() - self._open_at >= self.options.commit_interval_ms / 1000
        ):
            self._commit()

    def end_session(self, ledger: Ledger) -> None:
        """The session ended: an open Kafka transaction holding an entry that is not whole (its write was
        interrupted) is aborted now, once; if Kafka does not answer, before anything else is written (``committed``).
        One whose entries are all whole stays open for a stop's ``flush`` to commit. A commit still running is
        waited for; if it failed, what it and the buffer held is dropped and its transaction aborted as above."""
        if self._commit_run is not None and not self._settle_running_commit():
            return
        if self._open_at is None or self._all_whole():
            return
        begun = self._begun
        held = self._drop_open()
        if not begun:  # only buffered: nothing of it in Kafka
            log.info("dropping the buffered records of an interrupted write", entries=len(held))
            return
        log.info("aborting the Kafka transaction of an interrupted write", entries=len(held))
        self._abort_at_end()

    def _settle_running_commit(self) -> bool:
        """At a session's end (no exception may leave it): wait for the running commit; True when it succeeded.
        If it did not, every entry it and the buffer held is dropped, and its transaction aborted (now, or first
        thing in the next session)."""
        commit = self._commit_run
        assert commit is not None
        commit.wait()
        if commit.succeeded:
            self._commit_succeeded(commit)
            return True
        held = self._drop_open()
        log.warning(
            "a Kafka commit failed as the session ended; aborting it", error=commit.failure(), entries=len(held)
        )
        self._abort_at_end()
        return False

    def _abort_at_end(self) -> None:
        try:
            self.transport.producer.abort_transaction(_ABORT_TIMEOUT_S)
        except KafkaException as exc:
            self._abort_pending = True
            log.warning("cannot abort the Kafka transaction now; it is aborted first thing", error=exc.args[0].str())

    def _abort_open(self, why: str) -> None:
        """Abort the open Kafka transaction (if any): its entries are dropped from the ledger, never finished."""
        if self._commit_run is not None:  # not left running by a session's end (end_session settles it)
            self._settle_running_commit()
        if self._open_at is None:
            return
        begun = self._begun
        held = self._drop_open()
        log.info("aborting the open Kafka transaction", reason=why, entries=len(held))
        if begun:
            self._retrying("abort a Kafka transaction", lambda: self.transport.producer.abort_transaction(1.0))

    def _drop_open(self) -> list[Entry]:
        """Forget the open Kafka transaction, a commit not known to have succeeded and the buffer: their entries
        leave the ledger and what they wrote is not written."""
        commit, ledger = self._commit_run, self._progress
        held = [*(commit.held if commit is not None else []), *self._held]
        self._commit_run = None
        self._forget_open()
        self._position = self._committed.position
        if ledger is not None:
            ledger.drop(held)
        return held

    def _commit(self) -> None:
        """Write the progress record and start the commit (in its thread); the held entries are finished once it
        succeeded (``_commit_finished``). Never a Kafka transaction holding part of a PostgreSQL transaction or
        snapshot batch: that one is aborted."""
        assert self._commit_run is None
        if not self._begun:  # held in the buffer across a session's end, for a stop's flush
            self._begin()
        held, progress = self._held, self._progress
        assert progress is not None
        if not self._all_whole():
            self._abort_open("it holds a write that was interrupted")
            return
        for entry in held:  # snapshot progress first (in memory): the record carries the state after these rows
            done, entry.done = entry.done, None
            if done is not None:
                done()
        flush = max([self._committed.flush_lsn, *(entry.end_lsn for entry in held)])
        committed = Committed(flush, self._position, self.snapshot_state())
        key, value = records.encode(self.slot, self.system_id, committed)
        self._emit(self.progress_topic, key, value, None)
        producer = self.transport.producer
        commit = partial(producer.commit_transaction, _COMMIT_TIMEOUT_S)
        self._commit_run = _Commit(self._committer, commit, held, committed)
        self._forget_open()

    def _commit_finished(self, *, wait: bool = False) -> None:
        """If the running commit ended (or, with ``wait``, once it has): finish what it held, or retry it here
        (a failure rewinds or stops as ``_retrying`` says). Then what waited in the buffer is begun."""
        commit = self._commit_run
        if commit is None or (commit.running and not wait):
            return
        commit.wait()
        self._retrying("commit a Kafka transaction", commit.again)
        self._commit_succeeded(commit)
        if self._held:
            self._begin()

    def _commit_succeeded(self, commit: _Commit) -> None:
        self._commit_run = None
        self._committed = commit.committed
        self.kafka_transactions += 1
        if commit.committed.snapshot is not None:
            self.snapshot_committed()
        progress = self._progress
        assert progress is not None
        for entry in commit.held:
            progress.ack(entry)

    def _all_whole(self) -> bool:
        return self._whole and all(entry.sealed for entry in self._held)

    def _forget_open(self) -> None:
        self._open_at, self._held, self._begun, self._whole = None, [], False, True
        self._buffer, self._buffered = [], 0

    def _retrying(self, what: str, call: Callable[[], None]) -> None:
        """``call`` until it succeeds: retriable errors (Kafka away, a timeout) are retried with status updates
        going on (logged every ``WAITING_LOG_S``); an abortable one aborts the transaction and rewinds; a fatal
        one (fenced) stops."""
        logged_at = None
        while True:
            try:
                call()
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
            self.transport.raise_failure()
            if error.fatal() or error.code() in _FENCED:
                raise SinkFailure(self._fatal(what, error))
            if error.txn_requires_abort():
                self._abort(what, error)
            if not error.retriable():
                raise SinkFailure(f"cannot {what}: {error.str()}")
            # e.g. a broker without a transaction coordinator (transaction.state.log.* above the brokers)
            logged_at = log_wait("Kafka", what, error.str(), logged_at)
            self.transport.keep_alive()

    def _fatal(self, what: str, error: KafkaError) -> str:
        if error.code() in _FENCED:
            return (
                f"another producer with transactional.id {self.transactional_id} took over (fenced): is a second"
                " cdcd running for this slot? This one stops; nothing it had not committed was confirmed"
            )
        return f"cannot {what}: {error.str()} (fatal)"

    def _abort(self, what: str, error: KafkaError) -> None:
        log.warning("Kafka transaction failed; aborting it and starting again from the last commit", error=error.str())
        self._drop_open()
        self._retrying("abort a Kafka transaction", lambda: self.transport.producer.abort_transaction(1.0))
        raise SinkRewind(f"cannot {what}: {error.str()}")

    def _explain(self, error: KafkaError) -> str | None:
        """A client error that fenced this producer, named (``KafkaTransport.client_error``). A fatal one only: a
        non-fatal one comes back from the transaction calls, as abortable, and rewinds."""
        return self._fatal("write", error) if error.fatal() and error.code() in _FENCED else None
