"""The replication loop: the I/O around ``ReplicationCore``. Reads walsender frames, acts on the core's events
(sink, snapshotter), sends status updates, keeps metrics' state, and reconnects.

A lost connection is retried with exponential backoff; unfinished transactions are dropped and the server
sends them again from the slot's confirmed position. Status updates go out every ``status_interval_s``,
whenever the server asks, and once more on stop.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from cdcd.assembly import Assembler, BufferPool
from cdcd.batches import Shaped
from cdcd.config import Settings
from cdcd.filters import FilterPlan, FilterStats, RowFilter
from cdcd.filters.messages import MessageFilter
from cdcd.heartbeat import HeartbeatClock
from cdcd.ledger import Ledger, Positions
from cdcd.lsn import format_lsn, pg_now_us
from cdcd.metrics import State
from cdcd.notify import Notifier
from cdcd.pgoutput import Decoder
from cdcd.plan import Plans
from cdcd.replication.core import Event, Publish, ReplicationCore, Silence, SnapshotRequest, Stats, Watermark, Write
from cdcd.replication.lane import Lane, carry_out
from cdcd.replication.start import check_timeline, committed_snapshot, resumable, slot_request
from cdcd.rowstage import IMPL, STAGE
from cdcd.sink import SessionContext, ShapingSink, Sink, SinkRewind, SnapshotEncoding
from cdcd.snapshot.meter import SnapshotMeters
from cdcd.snapshot.notifications import Notices
from cdcd.snapshot.reader import SnapshotReader
from cdcd.snapshot.runner import Parallel, Snapshotter, start_state
from cdcd.snapshot.signals import SignalSource
from cdcd.snapshot.sizing import ChunkSize
from cdcd.snapshot.state import SnapshotState, StateStore
from cdcd.snapshot.untrusted import Rejections
from cdcd.source.primary import Primary
from cdcd.source.standby import Writes
from cdcd.source.walsender import (
    SessionInfo,
    SlotActive,
    SourceDisconnected,
    SourceError,
    StopRequested,
    Timeouts,
    Walsender,
)

if TYPE_CHECKING:
    from cdcd.shaping import EventShaper

log = structlog.get_logger("cdcd.replication")

SNAPSHOT_BACKPRESSURE = 50_000  # messages in flight in the sink above which no snapshot chunk is read
# While a read-only snapshot window waits for the stream to pass its position, the server is asked for a keepalive
# (its position) this often: an idle server sends one only every wal_sender_timeout / 2.
POSITION_ASK_S = 0.1
STOP_CHECK_S = 0.2  # how often a thread looks for a stop request while the main thread waits on the server


class _Stopped(Exception):
    """Stop was requested during the initial snapshot."""


class ReplicationLoop:
    def __init__(
        self,
        settings: Settings,
        sink: Sink,
        stop: threading.Event | None = None,
        notifier: Notifier | None = None,
        *,
        signals: SignalSource | None = None,
        shaper: EventShaper | None = None,
    ) -> None:
        self.settings = settings
        self.signals = signals  # the Kafka signal topic (signals.kafka.topic)
        self._signals_due = 0.0
        self.notifier = notifier or Notifier(None)
        self.sink = sink
        self.shaper = shaper  # the sink's shaper (a ShapingSink's), for the compiled lane
        self.stop = stop or threading.Event()
        self.ledger = Ledger()
        self.pool = BufferPool(settings.buffer.memory_limit, settings.buffer.spill_dir)
        self.stats = Stats()
        self.filter_stats = FilterStats()
        source = settings.source  # the user's logical decoding messages published; those left out count as filtered
        self.messages = MessageFilter(source.messages, source.message_prefixes.selection(), self.filter_stats.filtered)
        self._next_slot_check = 0.0
        self._next_table_check = 0.0
        self._reader: SnapshotReader | None = None  # the session's catalog reader (snapshots, captured tables)
        self.core: ReplicationCore | None = None
        self._shaping: ShapingSink | None = None  # the sink as one that takes the lane's Shaped events (_lane)
        self.snapshotter: Snapshotter | None = None
        self.snapshot_rows: Counter[str] = Counter()  # rows snapshotted, by table
        self.meters = SnapshotMeters(settings.snapshot.progress_interval_s)  # kept across reconnects
        # the rows of an incremental chunk: fewer after one that outlasted its deadline, which ends the session
        self.chunk_sizes = ChunkSize(settings.snapshot.chunk_size, Timeouts.of(settings.source).deadline_s)
        self._captured: list[str] = []
        self._recent_xids: deque[int] = deque(maxlen=4096)  # transactions just written (chunk visibility check)
        self.store: StateStore | None = None  # the session's state file (snapshot state, positions)
        self._streamed = False  # the current session reached streaming
        self._positions_due = 0.0  # when the positions may be saved again (monotonic seconds)
        self._awaited: tuple[int | None, float] = (None, 0.0)  # a read-only window's position, when last asked for
        self._standby = False  # the server of the last session was a standby (``Positions.standby``)
        self.state = State(
            oldest_unacked_commit=self.ledger.oldest_commit_time,
            transactions=self.stats.outcomes,
            open_streamed=lambda: self.core.assembler.open_streams if self.core else 0,
            buffer_bytes=lambda: (self.pool.memory_bytes, self.pool.spilled_bytes),
            filtered=self.filter_stats.filtered,
            snapshot_tables_pending=lambda: len(self.snapshotter.state.queue) if self.snapshotter else 0,
            snapshot_meters=self.meters,
            slot=settings.source.slot,
        )
        self.rejections = Rejections(self.state.control_rejected)
        self._request_key: bytes | None = None  # snapshot.request_key, read when run starts

    def run(self) -> None:
        """Stream until ``stop`` is set. Raises on errors that retrying cannot fix."""
        self._sweep_spill_files()
        self._request_key = self.settings.snapshot.request_key(create=True)
        try:
            self._sessions()
        finally:
            self.pool.release()

    def _sweep_spill_files(self) -> None:
        """Spill files a killed process left behind (``cdcd.assembly.spill``): nothing reads them again."""
        try:
            swept = self.pool.sweep()
        except OSError as exc:
            log.warning("cannot sweep spill files", spill_dir=str(self.pool.spill_dir), error=str(exc))
            return
        if swept.files or swept.directories:
            log.info(
                "swept spill files left by stopped processes",
                spill_dir=str(self.pool.spill_dir),
                files=swept.files,
                bytes=swept.bytes,
                directories=swept.directories,
            )

    def _sessions(self) -> None:
        reconnect = self.settings.source.reconnect
        delay = reconnect.initial_backoff_s
        failures = 0
        slot_busy_since: float | None = None
        while not self.stop.is_set():
            self._streamed = False
            try:
                self._session()
                return
            # a stop while the sink waited for Kafka in a stop's flush (unconfirmed, sent again), or while the slot
            # was being created
            except (_Stopped, StopRequested):
                return
            except (SourceDisconnected, SinkRewind) as exc:
                if self._streamed:  # a session that worked: the next failure starts the backoff afresh
                    delay, failures = reconnect.initial_backoff_s, 0
                slot_busy_since = self._slot_busy(exc, slot_busy_since)
                failures += 1
                if reconnect.max_attempts and failures > reconnect.max_attempts:
                    raise
                self.stats.reconnects += 1
                self._waiting_to_reconnect(str(exc), delay)
                if self.stop.wait(delay):
                    return
                delay = min(delay * 2, reconnect.max_backoff_s)

    def _slot_busy(self, exc: Exception, since: float | None) -> float | None:
        """While the slot is held by another connection, since when (None: it is not); past
        ``reconnect.slot_active_wait_s`` that is an error."""
        if not isinstance(exc, SlotActive):
            return None
        now = time.monotonic()
        since = now if since is None else since
        waited = self.settings.source.reconnect.slot_active_wait_s
        if now - since >= waited:
            raise SourceError(f"{exc} for {waited:g} s (source.reconnect.slot_active_wait_s): giving up") from None
        return since

    def _waiting_to_reconnect(self, error: str, delay: float) -> None:
        self.state.postgresql_up = self.state.streaming = False
        self.state.phase = "reconnecting"
        self.state.heartbeat = time.monotonic()  # waiting to retry is the loop working
        self.notifier.watchdog()
        self.notifier.status(f"reconnecting: {error}")
        log.warning(
            "source disconnected; retrying",
            error=error,
            retry_in_s=round(delay, 2),
            flushed_lsn=format_lsn(self.ledger.flushed_lsn),
        )

    def _session(self) -> None:
        """One replication session: connect, resume, snapshot, stream until stopped or until an error. However it
        ends, nothing it did not hand to the sink whole stays in the ledger (``_end_session``); on a stop, the sink
        finishes what it was handed and that much is confirmed."""
        source, mode = self.settings.source, self.settings.snapshot.mode
        if mode == "initial_only":
            source = source.model_copy(update={"temporary_slot": True})  # nothing streams from it afterwards
        store = self.store = StateStore(self.settings.snapshot.state_dir, source.slot)
        saved = None if source.temporary_slot else store.load()
        writes, primary = Writes.of(self.settings), Primary.of(source)
        push_down = self.settings.filters.push_down
        with Walsender(source, push_down, writes=writes, primary=primary, stop=self.stop) as walsender:
            request = slot_request(mode, saved, store.path)
            info = walsender.open(
                export_snapshot=request.export_snapshot,
                replace_lost=request.replace_lost,
                must_exist=request.must_exist,
            )
            if info.slot_created and not source.temporary_slot:
                self._save_plan(walsender, info, store, saved)
            self.core = None
            try:
                with contextlib.suppress(_Stopped):
                    self._serve(walsender, info, store, saved)
            finally:
                self._end_session()
            # Stopping: let the sink finish what it was handed, then confirm that much.
            if not self.sink.flush(self.settings.sink.flush_timeout_s):
                log.warning("sink did not finish before stopping; unconfirmed work will be sent again on restart")
            self.sink.poll()
            if self.core is not None and self._streamed:  # not in COPY before START_REPLICATION (initial_only)
                self._send_status(walsender, self.core)
            self._save_positions()

    def _save_plan(
        self, walsender: Walsender, info: SessionInfo, store: StateStore, saved: SnapshotState | None
    ) -> None:
        """The snapshot plan of the slot created now, saved before anything else can fail (Kafka away, a stop, a
        lost connection, a kill): a restart resumes it, never finds the slot without state. A plan that cannot
        be saved drops the slot."""
        try:
            captured = walsender.captured()
            mode, point = self.settings.snapshot.mode, info.consistent_point
            relations, parts = captured.relations, captured.partitions
            plan = start_state(None, store.slot, mode, point, list(relations), relations=relations, partitions=parts)
            plan.fresh_slot = True
            plan.signal_offsets = {} if saved is None else dict(saved.signal_offsets)
            store.save(plan)
        except BaseException:
            walsender.drop_slot()
            raise

    def _serve(self, walsender: Walsender, info: SessionInfo, store: StateStore, saved: SnapshotState | None) -> None:
        source, mode = walsender.settings, self.settings.snapshot.mode
        fresh = info.slot_created or (saved is not None and saved.fresh_slot)  # nothing was written from the slot
        committed = self.sink.committed(source.slot, info.system_id, fresh, self._beat_unless_stopped)
        if committed is not None:
            self.ledger.resume_at(committed.flush_lsn)
            saved = committed_snapshot(committed, saved, store)
        signal_offsets = {} if saved is None else saved.signal_offsets  # kept when a lost slot is made anew
        saved = resumable(saved, info, source.slot)
        log.info(
            "connected",
            slot=source.slot,
            protocol=info.protocol_version,
            server=info.server_version,
            slot_created=info.slot_created,
            timeline=info.timeline,
            row_stage=IMPL,  # compiled (cdcd._native) or the Python reference (CDCD_IMPL)
        )
        self._check_timeline(info, walsender, store)
        plans = Plans()
        decoder = Decoder(
            info.encoding,
            parallel_streaming=info.parallel_streaming,
            stage=STAGE,
            describe=walsender.describe,
            labels=walsender.labels,
        )
        core = self.core = ReplicationCore(
            decoder,
            Assembler(self.pool),
            self.ledger,
            rowfilter=self._rowfilter(info.filter_plan, walsender, plans),
            messages=self.messages,
            status_interval_s=source.status_interval_s,
            receive_timeout_s=source.receive_timeout_s,
            stats=self.stats,
            recent_xids=self._recent_xids,
        )
        reader = SnapshotReader(
            source.dsn.get_secret_value(),
            source.read_password(),
            source.slot,
            Timeouts.of(source),
            STAGE.copy_row_reader(),
            read_rows=STAGE.copy_rows_reader(),
            read_only=self.settings.snapshot.read_only,
            standby=info.standby,
            primary=walsender.primary if info.standby else None,
            publications=source.publication_names,
        )
        try:
            captured = reader.captured(source.publication_names)
            self._captured = list(captured.relations)
            created = info.consistent_point if info.slot_created else None
            new_tables = self.settings.snapshot.new_tables
            state = start_state(
                saved,
                source.slot,
                mode,
                created,
                self._captured,
                new_tables=new_tables,
                relations=captured.relations,
                partitions=captured.partitions,
            )
            state.signal_offsets = state.signal_offsets or dict(signal_offsets)
            store.save(state)
            self._save_positions()
            self.snapshotter = core.watcher = Snapshotter(
                reader,
                self.sink,
                self.ledger,
                store,
                state,
                info.filter_plan,
                self.settings.snapshot.chunk_size,
                decoder.types,
                self._count_snapshot_rows,
                self.meters,
                save_on_done=not self.sink.transactional,
                notices=self._notices(),
                parallel=self._parallel(reader),
                request_key=self._request_key,
                rejections=self.rejections,
                renamed=partial(self._captured_name, reader),
                columns=self.settings.columns.rules(),
                sizes=self.chunk_sizes,
            )
            self._reader = reader
            if self.signals is not None:
                self.signals.start(state.signal_offsets)
            self.state.postgresql_up = True
            self.state.server, self.state.server_version = reader.server(), _version(info.server_version)
            context = SessionContext(
                info.database, decoder.types, self._beat_unless_stopped, plans, *self._snapshot_hooks()
            )
            initial = info.exported_snapshot is not None and state.initial == "running"
            if initial and (
                not self._initial_snapshot(info, self.snapshotter, context, reader) or mode == "initial_only"
            ):
                return
            walsender.start_replication(self.ledger.flushed_lsn)
            core.heard(time.monotonic())
            log.info(
                "streaming",
                slot=source.slot,
                start_lsn=format_lsn(self.ledger.flushed_lsn),
                snapshots_queued=len(state.queue),
            )
            self.state.streaming, self.state.phase = True, "streaming"
            self._streamed = True
            self.notifier.ready(f"streaming from slot {source.slot}")
            keep_alive = partial(self._keep_alive, walsender, core)
            self.sink.start_session(
                SessionContext(info.database, decoder.types, keep_alive, plans, *self._snapshot_hooks(), info.encoding)
            )
            self._stream(walsender, core)
        finally:
            self._reader = None
            self.state.streaming = False
            core.reset()
            if self.snapshotter is not None:
                self.snapshotter.reset()
            reader.close()

    def _end_session(self) -> None:
        """The session ended, for whatever reason: the sink gives up what it holds that is not whole (with
        exactly-once, the open Kafka transaction is aborted unless every entry in it is whole), and the ledger
        drops the entries that were not handed over whole: never confirmed, sent again by the server."""
        self.state.streaming = False
        self.sink.end_session(self.ledger)
        dropped = self.ledger.end_session()
        if dropped:
            log.info("dropped a write the session did not finish; the server sends it again", entries=dropped)

    def _check_timeline(self, info: SessionInfo, walsender: Walsender, store: StateStore) -> None:
        """After a promotion (the timeline changed since the last session, in this process or, from the state
        file, an earlier one), the slot must have been synced and hold nothing cdcd published beyond the new
        primary's history."""
        ledger, positions = self.ledger, store.positions
        previous = ledger.timeline or positions.timeline
        standby = self._standby if ledger.timeline else positions.standby
        published = max(ledger.published_lsn, positions.published_lsn)
        check_timeline(previous, info, walsender, published, ledger.flushed_lsn, standby_slot=standby)
        ledger.timeline, self._standby = info.timeline, info.standby

    def _save_positions(self, now: float | None = None) -> None:
        """What the promotion check of a later process needs (the timeline, what was published), in the state
        file, when it changed: with ``now`` (a status update's) at most every ``status_interval_s`` (status updates
        go out every 50 ms while the sink keeps catching up), else at once."""
        if self.store is None or self.settings.source.temporary_slot or not self.ledger.timeline:
            return
        if now is not None and now < self._positions_due:
            return
        self._positions_due = (now or time.monotonic()) + self.settings.source.status_interval_s
        self.store.save_positions(Positions(self.ledger.timeline, self.ledger.published_lsn, self._standby))

    def _captured_name(self, reader: SnapshotReader, relation_id: int) -> str | None:
        """The name a captured table has now, by its relation id (None: it is captured no longer)."""
        relations = reader.captured(self.settings.source.publication_names).relations
        return next((name for name, oid in relations.items() if oid == relation_id), None)

    def _parallel(self, reader: SnapshotReader) -> Parallel | None:
        """The initial snapshot's connections when ``snapshot.parallelism`` > 1 (None: on ``reader``'s alone)."""
        connections, source = self.settings.snapshot.parallelism, self.settings.source
        if connections < 2:
            return None

        def open_reader() -> SnapshotReader:
            dsn, password = source.dsn.get_secret_value(), source.read_password()
            timeouts = Timeouts.of(source)
            row, rows = STAGE.copy_row_reader(), STAGE.copy_rows_reader()
            publications = source.publication_names
            return SnapshotReader(dsn, password, source.slot, timeouts, row, read_rows=rows, publications=publications)

        encoder = self.sink.snapshot_encoder if isinstance(self.sink, SnapshotEncoding) else None
        return Parallel(connections, open_reader, reader.split, encoder)

    def _initial_snapshot(
        self, info: SessionInfo, snapshotter: Snapshotter, context: SessionContext, reader: SnapshotReader
    ) -> bool:
        """Read the tables in the slot's exported snapshot, and wait until the sink has all of it; False when a
        stop was asked for first. A stop request cancels the statement ``reader`` runs: a COPY whose filter
        passes few rows would otherwise go on for minutes before its next batch looks at the stop request."""
        self.notifier.ready("initial snapshot")
        self.state.streaming = True  # ready: the daemon is doing its work (and Prometheus keeps scraping it)
        self.state.phase = "initial snapshot"
        self.sink.start_session(context)
        assert info.exported_snapshot is not None
        try:
            with self._cancelled_on_stop(reader):
                snapshotter.run_initial(info.exported_snapshot, self._snapshot_poll)
        except (_Stopped, SourceDisconnected, SourceError) as exc:
            if not isinstance(exc, _Stopped) and not self.stop.is_set():
                raise
            self._initial_aborted(snapshotter)
            raise _Stopped from None  # a statement the stop cancelled
        while self.ledger.pending and not self.stop.is_set():
            self.sink.flush(1.0)
            self._write_notices()
            self._beat()
        if self.stop.is_set():
            self._initial_aborted(snapshotter)
            return False  # what was acknowledged is saved: a restart resumes after it
        snapshotter.initial_finished()
        point = format_lsn(info.consistent_point or 0)
        log.info("initial snapshot done", rows=self.snapshot_rows.total(), consistent_point=point)
        return True

    @contextlib.contextmanager
    def _cancelled_on_stop(self, reader: SnapshotReader) -> Iterator[None]:
        """While the block runs, a stop request cancels the statement ``reader`` runs (checked by a thread of its
        own every ``STOP_CHECK_S``: the main thread waits on the server)."""
        done = threading.Event()

        def watch() -> None:
            while not done.wait(STOP_CHECK_S):
                if self.stop.is_set():
                    log.info("stop requested: cancelling the snapshot's statement")
                    reader.cancel()
                    return

        watcher = threading.Thread(target=watch, name="cancel-on-stop", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    def _initial_aborted(self, snapshotter: Snapshotter) -> None:
        snapshotter.initial_aborted()
        with contextlib.suppress(_Stopped):  # a sink waiting for Kafka gives up at once: a stop was asked for
            self._write_notices()

    def _notices(self) -> Notices | None:
        """Debezium's snapshot notifications, when ``notifications.kafka.topic`` is set and the sink is Kafka's."""
        if self.settings.notifications.kafka.topic is None or not isinstance(self.sink, ShapingSink):
            return None
        return Notices(self.settings.kafka.topic_prefix)

    def _write_notices(self) -> None:
        """Hand the notifications made since the last call to the sink (never from inside a sink's callback)."""
        snapshotter, sink = self.snapshotter, self.sink
        if snapshotter is None or snapshotter.notices is None or not snapshotter.notices.pending:
            return
        topic = self.settings.notifications.kafka.topic
        assert topic is not None
        assert isinstance(sink, ShapingSink)
        for notification in snapshotter.notices.take():
            sink.write_notification(topic, notification, self.ledger)

    def _signals_if_due(self) -> None:
        """Read the signal topic every ``signals.kafka.poll_interval_s`` and act on what came."""
        snapshotter, signals = self.snapshotter, self.signals
        now = time.monotonic()
        if signals is None or snapshotter is None or now < self._signals_due:
            return
        self._signals_due = now + self.settings.signals.kafka.poll_interval_s
        for record in signals.poll():
            snapshotter.signal(record, self.settings.kafka.topic_prefix, self._captured)

    def _snapshot_hooks(self) -> tuple[Callable[[], dict[str, Any] | None], Callable[[], None]]:
        """For an exactly-once sink: the snapshot state to commit with the data, and what saves it after."""
        snapshotter = self.snapshotter
        if snapshotter is None:
            return (lambda: None), (lambda: None)
        return snapshotter.committable, snapshotter.saved

    def _count_snapshot_rows(self, table: str, rows: int) -> None:
        self.snapshot_rows[table] += rows

    def _beat(self) -> None:
        self.state.heartbeat = time.monotonic()
        self.notifier.watchdog()

    def _beat_unless_stopped(self) -> None:
        """The sink waits for Kafka (a full queue, a topic being made): a stop request ends the wait; what it
        waited for is not confirmed, so a restart sends it again."""
        if self.stop.is_set():
            raise _Stopped
        self._beat()

    def _keep_alive(self, walsender: Walsender, core: ReplicationCore) -> None:
        """As ``_beat_unless_stopped``, and status updates go on meanwhile (or the server drops the connection)."""
        if self.stop.is_set():
            raise _Stopped
        self._status_if_due(walsender, core)

    def _snapshot_poll(self) -> None:
        self.sink.poll()
        self._write_notices()
        self._beat()
        if self.stop.is_set():
            raise _Stopped

    def _stream(self, walsender: Walsender, core: ReplicationCore) -> None:
        core.next_status = time.monotonic() + core.status_interval_s
        act, sink = self._act, self.sink
        lane = self._lane(core)
        if lane is not None:  # a sink that takes what the lane makes takes changes encoded as they arrive too
            core.assembler.early = lane.shaper.early
        heartbeats = self._heartbeats()
        self._next_table_check = time.monotonic() + self.settings.source.table_check_interval_s
        while not self.stop.is_set():
            now = time.monotonic()
            wait = min(
                1.0, core.next_status - now, sink.wake_in(), heartbeats.wake_in(now), self._position_wake_in(now)
            )
            frames = walsender.read(timeout=max(0.0, wait))
            if frames:
                core.heard(time.monotonic())
            else:
                self._if_silent(walsender, core)
            reply = carry_out(frames, core, act, lane)
            sink.poll()
            self._heartbeat_if_due(walsender, heartbeats)
            self._new_tables_if_due(walsender)
            self._signals_if_due()
            if self.snapshotter is not None:
                self._snapshot_step(walsender, core, self.snapshotter)
            self._write_notices()
            self._report(walsender)
            if reply:
                self._send_status(walsender, core)
            else:
                self._status_if_due(walsender, core)
        self.state.phase = "stopping"

    def _snapshot_step(self, walsender: Walsender, core: ReplicationCore, snapshotter: Snapshotter) -> None:
        """Close a read-only window the stream passed, read the next chunk when the sink has room, and while a
        read-only window waits for the stream, ask the server for its position (at once for a new window)."""
        snapshotter.reached(core.position)
        if snapshotter.pending and self.sink.in_flight() < SNAPSHOT_BACKPRESSURE:
            snapshotter.next_chunk(core.recent_xids)
            snapshotter.reached(core.position)
        awaiting, now = snapshotter.awaiting, time.monotonic()
        if awaiting is None:
            self._awaited = (None, 0.0)
        elif awaiting != self._awaited[0] or now >= self._awaited[1] + POSITION_ASK_S:
            self._awaited = (awaiting, now)
            walsender.send(core.status_update(now, pg_now_us(), reply=True))

    def _position_wake_in(self, now: float) -> float:
        """Seconds until the server is asked for its position again (a read-only window waits), else 1."""
        if self._awaited[0] is None:
            return 1.0
        return max(0.0, self._awaited[1] + POSITION_ASK_S - now)

    def _heartbeats(self) -> HeartbeatClock:
        """The session's heartbeat clock: off unless ``kafka.heartbeat.interval_s`` and a Kafka sink."""
        interval = self.settings.kafka.heartbeat.interval_s if isinstance(self.sink, ShapingSink) else 0.0
        return HeartbeatClock(interval, time.monotonic())

    def _heartbeat_if_due(self, walsender: Walsender, heartbeats: HeartbeatClock) -> None:
        """Run the action query, then write a heartbeat record with the positions it finds."""
        sink = self.sink
        if not heartbeats.due(time.monotonic()) or not isinstance(sink, ShapingSink):
            return
        query = self.settings.kafka.heartbeat.action_query
        if query is not None:
            walsender.run_action(query)
        sink.write_heartbeat(heartbeats.beat(time.monotonic(), self.ledger, time.time_ns() // 1_000_000), self.ledger)

    def _new_tables_if_due(self, walsender: Walsender) -> None:
        """Every ``source.table_check_interval_s``: tables created since that a managed publication captures by
        pattern (or by schema on PostgreSQL 14) are added to it; then what every publication captures is looked up
        (a table added to one by hand, a partition attached), and what was not captured before is snapshotted with
        ``snapshot.new_tables``: the rows it held before its changes were published are not streamed."""
        interval, now = self.settings.source.table_check_interval_s, time.monotonic()
        if not interval or now < self._next_table_check:
            return
        self._next_table_check = now + interval
        added = walsender.add_new_tables() if walsender.tracks_new_tables else []
        snapshotter, reader = self.snapshotter, self._reader
        if snapshotter is None or reader is None:
            self._captured = sorted({*self._captured, *added})
            return
        captured = reader.captured(self.settings.source.publication_names)
        self._captured = list(captured.relations)
        snapshot = self.settings.snapshot.new_tables and self.settings.snapshot.mode != "never"
        snapshotter.captured_now(captured.relations, captured.partitions, snapshot)

    def _if_silent(self, walsender: Walsender, core: ReplicationCore) -> None:
        """A server silent for half of ``source.receive_timeout_s`` is asked for a keepalive; one silent for all
        of it is gone (a partition, a host that died: TCP alone would wait for minutes)."""
        now = time.monotonic()
        silence = core.silence(now)
        if silence is Silence.PING:
            walsender.send(core.ping(now, pg_now_us()))
        elif silence is Silence.LOST:
            timeout = self.settings.source.receive_timeout_s
            raise SourceDisconnected(
                f"no message from the server for {core.quiet_for(now):.0f} s (source.receive_timeout_s: {timeout:g})"
            )

    def _lane(self, core: ReplicationCore) -> Lane | None:
        """The compiled lane (``replication/lane.py``), when the sink can take what it makes (``Shaped``)."""
        sink, shaper = self.sink, self.shaper
        if shaper is not None and isinstance(sink, ShapingSink) and Lane.available(shaper, core.decoder):
            self._shaping = sink  # checked once: isinstance of a Protocol is slow (per Shaped event in _act)
            return Lane(core, shaper, sink.already_written)
        return None

    def _act(self, event: Event) -> bool:
        """Carry out one of the core's events; True when the server asked for a status update."""
        if isinstance(event, Write):
            self.sink.write_transaction(event.transaction, event.changes, self.ledger)
        elif isinstance(event, Shaped):
            shaping = self._shaping
            assert shaping is not None  # the lane runs only for such a sink (_lane)
            shaping.write_shaped(event, self.ledger)
        elif isinstance(event, Publish):
            self.sink.write_message(event.message, self.ledger)
        elif isinstance(event, Watermark):
            if self.snapshotter is not None:
                self.snapshotter.watermark(event.message)
        elif isinstance(event, SnapshotRequest):
            if self.snapshotter is not None:
                self.snapshotter.request(event.message, self._captured)
        else:
            return True
        return False

    def _report(self, walsender: Walsender) -> None:
        """Refresh what metrics read; now and then ask the server how much WAL the slot retains."""
        state, now = self.state, time.monotonic()
        state.heartbeat = now
        self.notifier.watchdog()
        state.received_lsn, state.flushed_lsn = self.ledger.received_lsn, self.ledger.flushed_lsn
        if now >= self._next_slot_check:
            self._next_slot_check = now + self.settings.metrics.slot_check_interval_s
            state.slot_retained_wal_bytes = walsender.slot_retained_wal()

    def _status_if_due(self, walsender: Walsender, core: ReplicationCore) -> None:
        self._beat()  # also called while blocked on a full sink queue
        if core.status_due(time.monotonic()):
            self._send_status(walsender, core)

    def _rowfilter(self, plan: FilterPlan, walsender: Walsender, plans: Plans) -> RowFilter | None:
        if not plan.has_filters:
            return None
        log.info("row filters active", tables=plan.filtered_tables(), unevaluable=self.settings.filters.unevaluable)
        return RowFilter(plan, self.settings.filters.unevaluable, walsender.ancestors, self.filter_stats, plans)

    def _send_status(self, walsender: Walsender, core: ReplicationCore) -> None:
        try:
            walsender.send(core.status_update(time.monotonic(), pg_now_us()))
        except SourceDisconnected:
            if not self.stop.is_set():
                raise
        ledger = self.ledger
        log.debug("status sent", write=format_lsn(ledger.received_lsn), flush=format_lsn(ledger.flushed_lsn))
        self._save_positions(time.monotonic())


def _version(server_version: int) -> str:
    """150004 -> 15.4"""
    return f"{server_version // 10000}.{server_version % 10000}"
