"""The flush LSN never passes work the sink has not finished."""

from __future__ import annotations

import pytest

from cdcd.ledger import Ledger


def test_flush_advances_only_over_a_finished_prefix() -> None:
    p = Ledger()
    a, b, c = p.open(100), p.open(200), p.open(300)
    for entry in (a, b, c):
        entry.outstanding += 2
        p.seal(entry)
    p.ack(b, 2)  # b finished before a: cannot be confirmed yet
    assert p.flushed_lsn == 0
    p.ack(a)
    assert p.flushed_lsn == 0
    p.ack(a)
    assert p.flushed_lsn == 200
    p.ack(c, 2)
    assert p.flushed_lsn == 300
    assert p.pending == 0


def test_unsealed_entry_holds_flush_back() -> None:
    p = Ledger()
    entry = p.open(100)
    entry.outstanding += 1
    p.ack(entry)
    assert p.flushed_lsn == 0  # more messages of this transaction may still come
    p.seal(entry)
    assert p.flushed_lsn == 100


def test_idle_keepalive_confirms_once_nothing_received_before_it_is_pending() -> None:
    p = Ledger(start_lsn=50)
    p.idle(400, in_transaction=True)
    assert p.flushed_lsn == 50
    entry = p.open(100)
    entry.outstanding += 1
    p.idle(400, in_transaction=False)
    assert p.flushed_lsn == 50
    later = p.open(450)  # received after the keepalive
    later.outstanding += 1
    p.seal(later)
    p.seal(entry)
    assert p.flushed_lsn == 50
    p.ack(entry)
    assert p.flushed_lsn == 100  # the later entry is still pending
    p.ack(later)
    assert p.flushed_lsn == 450
    p.idle(500, in_transaction=False)
    assert p.flushed_lsn == 500
    assert p.received_lsn == 500
    p.idle(300, in_transaction=False)
    assert p.flushed_lsn == 500  # never goes backwards


def test_keepalive_while_pending_is_confirmed_when_they_finish() -> None:
    p = Ledger(start_lsn=50)
    entry = p.open(100)
    p.idle(400, in_transaction=False)
    p.seal(entry)
    assert p.flushed_lsn == 400


def test_keepalive_is_forgotten_when_pending_work_is_dropped() -> None:
    p = Ledger(start_lsn=50)
    sealed, _unsealed = p.open(100), p.open(200)
    sealed.outstanding += 1
    p.seal(sealed)
    p.idle(400, in_transaction=False)
    assert p.end_session() == 1  # the server sends the transaction at 200 again: 400 is not whole any more
    p.ack(sealed)
    assert p.flushed_lsn == 100


def test_over_acknowledgement_is_an_error() -> None:
    p = Ledger()
    entry = p.open(1)
    with pytest.raises(RuntimeError):
        p.ack(entry)


def test_an_entry_of_several_transactions_reports_each_commit_time_once_finished() -> None:
    """The lane's unit holds many transactions: lag from the oldest, one finished commit time per transaction."""
    finished: list[float] = []
    p = Ledger(on_done=finished.append)
    single, batch = p.open(100, 5.0), p.open(300, commit_times=[6.0, 7.0, 8.0])
    batch.outstanding += 1
    p.seal(single)
    p.seal(batch)
    assert finished == [5.0]
    assert p.oldest_commit_time() == 6.0
    p.ack(batch)
    assert finished == [5.0, 6.0, 7.0, 8.0]
    assert p.flushed_lsn == 300
    assert p.oldest_commit_time() is None


def test_a_session_that_ends_drops_what_it_did_not_hand_over_whole() -> None:
    """An entry left unsealed (its write was interrupted) never finishes: it would hold the confirmed position
    back for good, and finishing it would confirm a transaction Kafka has part of."""
    done: list[int] = []
    p = Ledger()
    whole = p.open(100, done=lambda: done.append(100))
    whole.outstanding += 1
    p.seal(whole)
    partial = p.open(200, done=lambda: done.append(200))
    partial.outstanding += 3  # three messages produced, then the write was interrupted
    assert p.published_lsn == 200
    assert p.end_session() == 1
    assert p.pending == 1
    p.ack(partial)  # late acknowledgements of the dropped entry change nothing
    p.ack(whole)
    assert p.flushed_lsn == 100
    assert done == [100]
    later = p.open(300)
    p.seal(later)
    assert p.flushed_lsn == 300  # nothing left at the head blocks what comes next
    assert p.end_session() == 0


def test_dropping_whole_entries_lets_the_ones_before_them_finish() -> None:
    p = Ledger()
    first, second = p.open(100), p.open(200)
    first.outstanding += 1
    second.outstanding += 1
    p.seal(first)
    p.seal(second)
    p.drop([second])  # e.g. an aborted Kafka transaction held it
    p.ack(first)
    assert p.flushed_lsn == 100
    assert p.pending == 0
