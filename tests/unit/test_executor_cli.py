"""`timewheel worker` and `timewheel webhook` arguments: the pairs they serve, and the
command line a supervisor gives each of its consumers."""

from __future__ import annotations

import pytest

from timewheel.cli.executors import child_argv, pairs_of, run_executor
from timewheel.cli.parser import build_parser
from timewheel.errors import ConfigError, ValidationError


def test_every_tenant_with_every_queue() -> None:
    args = build_parser().parse_args(
        ["worker", "--app", "m:f", "--tenant", "a", "--tenant", "b", "--queue", "x", "--queue", "y"]
    )
    assert pairs_of(args) == [("a", "x"), ("a", "y"), ("b", "x"), ("b", "y")]
    single = build_parser().parse_args(["worker", "--app", "m:f", "--tenant", "a"])
    assert pairs_of(single) == [("a", "default")]


def test_a_tenant_may_be_a_pattern_of_registered_tenants() -> None:
    args = build_parser().parse_args(
        ["webhook", "--url", "https://h.test/", "--tenant", "acme-*", "--tenant", "b"]
    )
    assert pairs_of(args) == [("acme-*", "default"), ("b", "default")]


@pytest.mark.parametrize(
    "argv",
    [
        ["worker", "--app", "pkg.mod:handle", "--tenant", "a", "--tenant", "b"],
        ["worker", "--app", "m:f", "--tenant", "a", "--queue", "q", "--prefetch", "0"],
        ["worker", "--app", "m:f", "--tenant", "acme-[!x]*", "--tenant", "*"],
        [
            "webhook",
            "--url",
            "https://example.test/hook",
            "--allow-host",
            "h1",
            "--allow-host",
            "h2",
            "--timeout-s",
            "2.5",
            "--tenant",
            "a",
            "--log-json",
            "--log-level",
            "warning",
        ],
    ],
)
def test_a_consumer_gets_the_supervisor_s_options_but_processes(argv: list[str]) -> None:
    parser = build_parser()
    flags = ["--processes", "3", "--metrics-port", "9100", "--concurrency", "7"]
    flags += ["--redis-url", "redis://h:1", "--group", "g"]
    args = parser.parse_args([*argv, *flags])
    for index in range(3):
        child = parser.parse_args(child_argv(args, index))
        want = {**vars(args), "processes": 1, "metrics_port": 9100 + index}
        assert vars(child) == want


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (["--processes", "0"], ConfigError),
        (["--concurrency", "0"], ConfigError),
        (["--prefetch", "-1"], ConfigError),
        (["--tenant", "bad name"], ValidationError),
        (["--tenant", "bad name*"], ValidationError),
        (["--app", "nocolon"], ConfigError),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(
    extra: list[str], error: type[Exception]
) -> None:
    argv = ["worker", "--app", "timewheel.testing.apps:note", "--tenant", "a", *extra]
    with pytest.raises(error):
        run_executor(build_parser().parse_args(argv), run=None)
