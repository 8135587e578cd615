"""Event-log entries become archive rows: kinds it does not know are kept, a created
entry becomes a row per run, old and new shape."""

from __future__ import annotations

from timewheel.archive.events import EVENT_COLUMNS, event_rows


def test_archiver_stores_entries_it_does_not_know_instead_of_stopping() -> None:
    rows = event_rows(2, b"1700000000000-4", {b"e": b"fired", b"schedule": b"s1"})
    assert [r[:6] for r in rows] == [[2, 1700000000000, 4, "", "fired", 1700000000000]]
    assert event_rows(2, b"5-0", {b"e": b"dispatched", b"runs": b""}) == []
    [row] = event_rows(2, b"5-1", {b"e": b"dispatched", b"at": b"7", b"runs": b"s1@60000:3"})
    assert (row[3], row[8]) == ("s1@60000", 3)


def test_a_created_entry_becomes_a_row_per_run_old_and_new_shape() -> None:
    batch = {b"e": b"created", b"at": b"9", b"runs": b"00a1:acme:mail:500,00a2:beta:q:600"}
    rows = event_rows(10, b"9-0", batch)
    columns = ("run_id", "kind", "at_ms", "tenant", "queue", "due_ms")
    picked = [tuple(dict(zip(EVENT_COLUMNS, r, strict=True))[c] for c in columns) for r in rows]
    assert picked == [
        ("00a1", "created", 9, "acme", "mail", 500),
        ("00a2", "created", 9, "beta", "q", 600),
    ]
    # Entries written before one-entry-per-call name a single run in fields of its own.
    single = {b"e": b"created", b"id": b"00a3", b"tenant": b"acme", b"queue": b"q"}
    [row] = event_rows(10, b"9-1", {**single, b"due_ms": b"700", b"at": b"9"})
    assert (row[3], row[6], row[7], row[9]) == ("00a3", "acme", "q", 700)


def _picked(rows: list[list[object]], *columns: str) -> list[tuple[object, ...]]:
    return [tuple(dict(zip(EVENT_COLUMNS, r, strict=True))[c] for c in columns) for r in rows]


def test_a_batched_acked_entry_becomes_a_row_per_run_and_the_old_shape_still_reads() -> None:
    batch = {b"e": b"acked", b"at": b"9", b"runs": b"00a1:acme:1,00a2@60000:beta:3,bad,x:y:z"}
    columns = ("run_id", "kind", "at_ms", "tenant", "attempt", "due_ms", "error")
    assert _picked(event_rows(1, b"9-0", batch), *columns) == [
        ("00a1", "acked", 9, "acme", 1, None, None),
        ("00a2@60000", "acked", 9, "beta", 3, None, None),
    ]
    old = {b"e": b"acked", b"id": b"00a3", b"tenant": b"acme", b"attempt": b"2", b"at": b"9"}
    assert _picked(event_rows(1, b"9-1", old), *columns) == [
        ("00a3", "acked", 9, "acme", 2, None, None)
    ]


def test_a_batched_retry_entry_gives_each_run_its_due_time_and_error() -> None:
    columns = ("run_id", "tenant", "attempt", "due_ms", "reason", "error")
    shared = {
        b"e": b"retry_scheduled",
        b"at": b"9",
        b"reason": b"failed",
        b"runs": b"00a1:acme:1:500,00a2:acme:2:600",
        b"error": b"E: same",
    }
    assert _picked(event_rows(1, b"9-0", shared), *columns) == [
        ("00a1", "acme", 1, 500, "failed", "E: same"),
        ("00a2", "acme", 2, 600, "failed", "E: same"),
    ]
    each = {**shared, b"errors": b'["E: one", "E: \\u00e9"]'}
    del each[b"error"]
    assert [r[-1] for r in _picked(event_rows(1, b"9-1", each), *columns)] == ["E: one", "E: é"]
    old = {
        b"e": b"retry_scheduled",
        b"id": b"00a3",
        b"tenant": b"acme",
        b"attempt": b"1",
        b"at": b"9",
        b"due_ms": b"700",
        b"reason": b"lease_expired",
        b"error": b"lost",
    }
    assert _picked(event_rows(1, b"9-2", old), *columns) == [
        ("00a3", "acme", 1, 700, "lease_expired", "lost")
    ]
