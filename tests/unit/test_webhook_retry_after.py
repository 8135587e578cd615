"""The webhook executor's reading of a Retry-After header."""

from __future__ import annotations

from timewheel.runs.webhook import retry_after_s


def test_retry_after_header_forms() -> None:
    assert retry_after_s("7") == 7.0
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now_s=1445412470.0) == 10.0
    assert retry_after_s("soon") is None and retry_after_s(None) is None
