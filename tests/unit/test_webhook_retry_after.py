"""The webhook executor's reading of a Retry-After header."""

from __future__ import annotations

import time

from timewheel.runs.webhook import MAX_RETRY_AFTER_S, retry_after_s

SENT = "Wed, 21 Oct 2015 07:27:40 GMT"
LATER = "Wed, 21 Oct 2015 07:28:00 GMT"


def test_retry_after_header_forms() -> None:
    assert retry_after_s("7") == 7.0
    assert retry_after_s(LATER, now_s=1445412470.0) == 10.0
    assert retry_after_s("soon") is None and retry_after_s(None) is None


def test_an_http_date_is_read_against_the_answers_own_date_not_this_clock() -> None:
    # Twenty seconds after the server's Date, whatever this node's clock says: a node an
    # hour behind or 30 s ahead of the server waits the same 20 s.
    for skew_s in (-3600.0, 0.0, 30.0):
        assert retry_after_s(LATER, SENT, now_s=time.time() + skew_s) == 20.0
    # Without a usable Date, this node's clock is all there is.
    assert retry_after_s(LATER, "not a date", now_s=1445412470.0) == 10.0


def test_non_ascii_digits_and_absurd_values_are_no_crash() -> None:
    assert retry_after_s("\u00b2") is None  # '²'.isdigit() is true; int('²') raises
    assert retry_after_s("9" * 400) == MAX_RETRY_AFTER_S
    assert retry_after_s("Fri, 31 Dec 9999 23:59:59 GMT", SENT) == MAX_RETRY_AFTER_S
    assert retry_after_s(LATER, "Mon, 99 Foo 2015 99:99:99 GMT", now_s=1445412470.0) == 10.0
