"""The replication loop: walsender frames -> decoder -> assembler -> sink, with LSN feedback.

The flush LSN reported to PostgreSQL is ``Progress.flushed_lsn``: never past what the sink finished.
Status updates go out every ``status_interval_s``, whenever the server asks, and once more on stop.
A lost connection is retried with exponential backoff; unfinished transactions are dropped and the server
sends them again from the slot's confirmed position.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import partial

import structlog

from cdcd.assembly import Assembler, BufferPool, Transaction
from cdcd.config import Settings
from cdcd.filters import FilterPlan, FilterStats, RowFilter
from cdcd.lsn import format_lsn, pg_now_us
from cdcd.metrics import State
from cdcd.notify import Notifier
from cdcd.pgoutput import DecodeError, Decoder
from cdcd.pgoutput.messages import LogicalMessage, Message, RowChange
from cdcd.progress import Progress
from cdcd.sink import SessionContext, Sink
from cdcd.snapshot.meter import SnapshotMeters
from cdcd.snapshot.runner import Snapshotter, start_state
from cdcd.snapshot.state import StateStore
from cdcd.source.failover import FAILOVER_VERSION, PromotionError, check_promotion, switch_point
from cdcd.source.protocol import (
    XLOGDATA_PAYLOAD_OFFSET,
    parse_keepalive,
    parse_xlogdata_header,
    standby_status_update,
)
from cdcd.source.snapshot import REQUEST_PREFIX, WATERMARK_PREFIX, SnapshotReader
from cdcd.source.walsender import SessionInfo, SourceDisconnected, SourceError, Walsender

log = structlog.get_logger("cdcd.pipeline")

_W, _K = ord("w"), ord("k")
_CONTROL = (WATERMARK_PREFIX, REQUEST_PREFIX)  # cdcd's own logical decoding messages, never published


@dataclass
class Stats:
    transactions: int = 0
    changes: int = 0
    reconnects: int = 0
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (plain|streamed, commit|abort)


class _Stopped(Exception):
    """Stop was requested during the initial snapshot."""


class Pipeline:
    def __init__(
        self, settings: Settings, sink: Sink, stop: threading.Event | None = None, notifier: Notifier | None = None
    ) -> None:
        self.settings = settings
        self.notifier = notifier or Notifier(None)
        self.sink = sink
        self.stop = stop or threading.Event()
        self.progress = Progress()
        self.pool = BufferPool(settings.buffer.memory_limit, settings.buffer.spill_dir)
        self.stats = Stats()
        self.rowfilter: RowFilter | None = None
        self.filter_stats = FilterStats()
        self._next_status = 0.0
        self._next_slot_check = 0.0
        self._assembler: Assembler | None = None
        self.snapshotter: Snapshotter | None = None
        self.snapshot_rows: Counter[str] = Counter()  # rows snapshotted, by table
        self.meters = SnapshotMeters(settings.snapshot.progress_interval_s)  # kept across reconnects
        self._captured: list[str] = []
        self._recent_xids: deque[int] = deque(maxlen=4096)  # transactions just emitted (chunk visibility check)
        self._timeline = 0  # the server's timeline in the last session: a new one means a promotion
        self.published_lsn = 0  # end of the last transaction handed to the sink
        self.state = State(
            oldest_unacked_commit=self.progress.oldest_commit_time,
            transactions=self.stats.outcomes,
            open_streamed=lambda: self._assembler.open_streams if self._assembler else 0,
            buffer_bytes=lambda: (self.pool.memory_bytes, self.pool.spilled_bytes),
            filtered=self.filter_stats.filtered,
            snapshot_tables_pending=lambda: len(self.snapshotter.state.queue) if self.snapshotter else 0,
            snapshot_meters=self.meters,
            slot=settings.source.slot,
        )

    def run(self) -> None:
        """Stream until ``stop`` is set. Raises on errors that retrying cannot fix."""
        reconnect = self.settings.source.reconnect
        delay = reconnect.initial_backoff_s
        failures = 0
        while not self.stop.is_set():
            try:
                self._session()
                return
            except _Stopped:
                return
            except SourceDisconnected as exc:
                failures += 1
                if reconnect.max_attempts and failures > reconnect.max_attempts:
                    raise
                self.stats.reconnects += 1
                self.state.postgresql_up = self.state.streaming = False
                self.state.phase = "reconnecting"
                self.state.heartbeat = time.monotonic()  # waiting to retry is the loop working
                self.notifier.watchdog()
                self.notifier.status(f"reconnecting: {exc}")
                log.warning("source disconnected; retrying", error=str(exc), retry_in_s=round(delay, 2),
                            flushed_lsn=format_lsn(self.progress.flushed_lsn))  # fmt: skip
                if self.stop.wait(delay):
                    return
                delay = min(delay * 2, reconnect.max_backoff_s)

    def _session(self) -> None:
        source, mode = self.settings.source, self.settings.snapshot.mode
        if mode == "initial_only":
            source = source.model_copy(update={"temporary_slot": True})  # nothing streams from it afterwards
        store = StateStore(self.settings.snapshot.state_dir, source.slot)
        saved = None if source.temporary_slot else store.load()
        assembler = self._assembler = Assembler(self.pool)
        with Walsender(source, self.settings.filters.push_down) as walsender:
            reader: SnapshotReader | None = None
            try:
                must_exist = None
                if saved is not None and mode != "when_needed":
                    must_exist = f"{store.path} shows cdcd streamed from it"
                info = walsender.open(export_snapshot=mode != "never", replace_lost=mode == "when_needed",
                                      must_exist=must_exist)  # fmt: skip
                if saved is not None and info.slot_created:
                    log.error("the slot was lost or invalidated: changes it held are gone; snapshotting again",
                              slot=source.slot)  # fmt: skip
                    saved = None
                log.info("connected", slot=source.slot, protocol=info.protocol_version, server=info.server_version,
                         slot_created=info.slot_created, timeline=info.timeline)  # fmt: skip
                self._check_timeline(walsender, info)
                decoder = Decoder(info.encoding, parallel_streaming=info.parallel_streaming)
                self.rowfilter = self._rowfilter(info.filter_plan, walsender)
                reader = SnapshotReader(source.dsn.get_secret_value(), source.read_password(), source.slot)
                self._captured = reader.captured_tables([p.name for p in source.publications])
                created = info.consistent_point if info.slot_created else None
                state = start_state(saved, source.slot, mode, created, self._captured)
                store.save(state)
                self.snapshotter = Snapshotter(reader, self.sink, self.progress, store, state, info.filter_plan,
                                               self.settings.snapshot.chunk_size, decoder.types,
                                               self._count_snapshot_rows, self.meters)  # fmt: skip
                self._connected(info, reader)
                if info.exported_snapshot is not None and state.initial == "running":
                    self._initial_snapshot(info, self.snapshotter, decoder)
                    if mode == "initial_only" or self.stop.is_set():
                        return
                walsender.start_replication(self.progress.flushed_lsn)
                log.info("streaming", slot=source.slot, start_lsn=format_lsn(self.progress.flushed_lsn),
                         snapshots_queued=len(state.queue))  # fmt: skip
                self.state.streaming, self.state.phase = True, "streaming"
                self.notifier.ready(f"streaming from slot {source.slot}")
                keep_alive = partial(self._status_if_due, walsender)
                self.sink.start_session(SessionContext(info.database, decoder.types, keep_alive))
                self._stream(walsender, decoder, assembler)
            finally:
                self.state.streaming = False
                assembler.reset()
                if self.snapshotter is not None:
                    self.snapshotter.reset()
                if reader is not None:
                    reader.close()
            # Stopping: let the sink finish what it was handed, then confirm that much.
            if not self.sink.flush(self.settings.sink.flush_timeout_s):
                log.warning("sink did not finish before stopping; unconfirmed work will be sent again on restart")
            self.sink.poll()
            self._send_status(walsender)

    def _check_timeline(self, walsender: Walsender, info: SessionInfo) -> None:
        """After a promotion, the slot must have been synced and hold nothing cdcd published beyond the new
        primary's history; a synced slot a little behind cdcd is normal: streaming starts at cdcd's position."""
        previous, self._timeline = self._timeline, info.timeline
        if not previous or previous == info.timeline or info.slot_created or info.server_version < FAILOVER_VERSION:
            return
        switch = switch_point(walsender.timeline_history(info.timeline), previous)
        try:
            lag = check_promotion(walsender.slot_sync(), self.published_lsn, self.progress.flushed_lsn, switch)
        except PromotionError as exc:
            raise SourceError(f"after a failover (timeline {previous} -> {info.timeline}): {exc}") from None
        log.warning("the server was promoted; going on from cdcd's own position", previous_timeline=previous,
                    timeline=info.timeline, slot=lag, start_lsn=format_lsn(self.progress.flushed_lsn))  # fmt: skip

    def _initial_snapshot(self, info: SessionInfo, snapshotter: Snapshotter, decoder: Decoder) -> None:
        """Read the tables in the slot's exported snapshot, and wait until the sink has all of it."""
        self.notifier.ready("initial snapshot")
        self.state.streaming = True  # ready: the daemon is doing its work (and Prometheus keeps scraping it)
        self.state.phase = "initial snapshot"
        self.sink.start_session(SessionContext(info.database, decoder.types, self._beat))
        assert info.exported_snapshot is not None
        with contextlib.suppress(_Stopped):
            snapshotter.run_initial(info.exported_snapshot, self._snapshot_poll)
        while self.progress.pending and not self.stop.is_set():
            self.sink.flush(1.0)
            self._beat()
        if self.stop.is_set():
            self.sink.flush(self.settings.sink.flush_timeout_s)
            self.sink.poll()  # saves the progress of what was acknowledged: a restart resumes after it
            return
        snapshotter.initial_finished()
        log.info("initial snapshot done", rows=self.snapshot_rows.total(), consistent_point=format_lsn(
            info.consistent_point or 0))  # fmt: skip

    def _connected(self, info: SessionInfo, reader: SnapshotReader) -> None:
        state = self.state
        state.postgresql_up = True
        state.server, state.server_version = reader.server(), _version(info.server_version)

    def _count_snapshot_rows(self, table: str, rows: int) -> None:
        self.snapshot_rows[table] += rows

    def _beat(self) -> None:
        self.state.heartbeat = time.monotonic()
        self.notifier.watchdog()

    def _snapshot_poll(self) -> None:
        self.sink.poll()
        self._beat()
        if self.stop.is_set():
            raise _Stopped

    def _stream(self, walsender: Walsender, decoder: Decoder, assembler: Assembler) -> None:
        progress = self.progress
        self._next_status = time.monotonic() + self.settings.source.status_interval_s
        while not self.stop.is_set():
            frames = walsender.read(timeout=max(0.0, min(1.0, self._next_status - time.monotonic())))
            reply = False
            for frame in frames:
                kind = frame[0]
                if kind == _W:
                    data_start, wal_end = parse_xlogdata_header(frame)
                    progress.received(max(data_start, wal_end))
                    self._handle(decoder, assembler, frame[XLOGDATA_PAYLOAD_OFFSET:], data_start)
                elif kind == _K:
                    keepalive = parse_keepalive(frame)
                    progress.idle(keepalive.wal_end, assembler.in_transaction)
                    reply = reply or keepalive.reply_requested
                else:
                    raise DecodeError("CopyData", 0, f"unknown replication frame type {chr(kind)!r}")
            self.sink.poll()
            snapshotter = self.snapshotter
            if snapshotter is not None and snapshotter.pending and self.sink.in_flight() < 50_000:
                snapshotter.next_chunk(self._recent_xids)
            self._report(walsender)
            if reply:
                self._send_status(walsender)
            else:
                self._status_if_due(walsender)
        self.state.phase = "stopping"

    def _report(self, walsender: Walsender) -> None:
        """Refresh what metrics read; now and then ask the server how much WAL the slot retains."""
        state, now = self.state, time.monotonic()
        state.heartbeat = now
        self.notifier.watchdog()
        state.received_lsn, state.flushed_lsn = self.progress.received_lsn, self.progress.flushed_lsn
        if now >= self._next_slot_check:
            self._next_slot_check = now + self.settings.metrics.slot_check_interval_s
            state.slot_retained_wal_bytes = walsender.slot_retained_wal()

    def _status_if_due(self, walsender: Walsender) -> None:
        self.state.heartbeat = time.monotonic()  # also called while blocked on a full sink queue
        self.notifier.watchdog()
        if time.monotonic() >= self._next_status:
            self._send_status(walsender)

    def _rowfilter(self, plan: FilterPlan, walsender: Walsender) -> RowFilter | None:
        if not plan.has_filters:
            return None
        log.info("row filters active", tables=plan.filtered_tables(), unevaluable=self.settings.filters.unevaluable)
        return RowFilter(plan, self.settings.filters.unevaluable, walsender.ancestors, self.filter_stats)

    def _handle(self, decoder: Decoder, assembler: Assembler, payload: bytes, wal_lsn: int) -> None:
        try:
            message: Message | None = decoder.decode(payload, wal_lsn)
            if message.__class__ is RowChange:
                if self.rowfilter is not None:
                    message = self.rowfilter.apply(message)
                if message is not None:
                    assembler.feed(message)  # a row change never finishes anything
                return
            assert message is not None
            if message.__class__ is LogicalMessage and not self._keep_message(message):
                return
            aborted = assembler.aborted_transactions
            event = assembler.feed(message)
        except DecodeError as exc:
            exc.wal_lsn = wal_lsn
            raise
        if assembler.aborted_transactions != aborted:
            self.stats.outcomes["streamed", "abort"] += 1
        if event is None:
            return
        if isinstance(event, Transaction):
            self.stats.outcomes["streamed" if event.streamed else "plain", "commit"] += 1
            self.stats.transactions += 1
            self.stats.changes += event.change_count
            snapshotter = self.snapshotter
            if snapshotter is not None and snapshotter.window is not None:
                event.tap = snapshotter.observe
            self.sink.write_transaction(event, self.progress)
            self.published_lsn = event.end_lsn
            self._recent_xids.append(event.xid)
        elif event.prefix in _CONTROL and self.snapshotter is not None:
            if event.prefix == WATERMARK_PREFIX:
                self.snapshotter.watermark(event)
            else:
                self.snapshotter.request(event, self._captured)
        else:
            self.sink.write_message(event, self.progress)

    def _keep_message(self, message: LogicalMessage) -> bool:
        """Messages are always requested (snapshot watermarks); the user's go on only with source.messages."""
        return self.settings.source.messages or (not message.transactional and message.prefix in _CONTROL)

    def _send_status(self, walsender: Walsender) -> None:
        self._next_status = time.monotonic() + self.settings.source.status_interval_s
        progress = self.progress
        flushed = progress.flushed_lsn
        try:
            walsender.send(standby_status_update(progress.received_lsn, flushed, flushed, pg_now_us()))
        except SourceDisconnected:
            if not self.stop.is_set():
                raise
        log.debug("status sent", write=format_lsn(progress.received_lsn), flush=format_lsn(flushed))


def _version(server_version: int) -> str:
    """150004 -> 15.4"""
    return f"{server_version // 10000}.{server_version % 10000}"
