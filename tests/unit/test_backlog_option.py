"""The tenant commands' --max-backlog: a whole number, 0 (no cap) included; anything else
is a usage error (exit 2), not a traceback."""

from __future__ import annotations

import pytest

from timewheel.cli.parser import build_parser


def test_max_backlog_takes_zero_and_whole_numbers() -> None:
    parser = build_parser()
    assert parser.parse_args(["tenant", "create", "acme", "--max-backlog", "0"]).max_backlog == 0
    update = parser.parse_args(["tenant", "update", "acme", "--max-backlog", "5000"])
    assert update.max_backlog == 5000
    cleared = parser.parse_args(["tenant", "update", "acme", "--max-backlog", "none"])
    assert cleared.max_backlog is None


@pytest.mark.parametrize("bad", ["-1", "1.5", "lots"])
def test_a_bad_max_backlog_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["tenant", "update", "acme", "--max-backlog", bad])
    assert exit_.value.code == 2
    assert "whole number" in capsys.readouterr().err
