"""Cron fire times: the cost of next_fire and of a planner's plan_fires call, before/after.

For per-second, per-minute, hourly and daily crons (`* * * * * *`, `* * * * *`,
`0 * * * *`, `30 2 * * *`) in America/New_York, Europe/Berlin, Australia/Lord_Howe and
UTC, at instants drawn half uniformly over 2026-2027 and half within two hours of one of
the zone's DST transitions (a third of those within 90 s of it), each call is timed:

- `next_fire(spec, x)`;
- the planner's call, `plan_fires(spec, x, next + plan_horizon_ms / 4, 1000)`: the
  planner (timewheel/schedules/planner.py) extends a schedule once its next unplanned
  fire time `next` is within 3/4 of the horizon from now, up to now + the horizon.

Both run against this tree's timewheel/schedules/spec.py (after) and against a copy of
an older one read with `git show` (before; --before), interleaved call by call, in
alternating order, in one process. The --before version takes about 0.7 s an instant
for a per-second cron, so for that shape it is timed on the first --before-slow only.
Schedules/s is what one planner pass sustains in Python alone: 1 s over the mean cost
of the planner's call at the uniform instants. Both versions' answers are compared;
`differ` counts the samples where they disagree.

Run:  .venv/bin/python bench/cron.py                 (about 4 minutes)
      .venv/bin/python bench/cron.py --quick --out /tmp/cron.json
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import platform
import random
import subprocess
import sys
import time
import types
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from common import percentile

from timewheel.config import Settings
from timewheel.schedules import spec as after_spec
from timewheel.schedules.ops import MAX_FIRES_PER_CALL

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "cron.json"
SHAPES = {
    "per-second": "* * * * * *",
    "per-minute": "* * * * *",
    "hourly": "0 * * * *",
    "daily": "30 2 * * *",
}
ZONES = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "UTC"]
FROM_MS = round(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
TO_MS = round(datetime(2028, 1, 1, tzinfo=UTC).timestamp() * 1000)
HOUR_MS = 3_600_000


def load_before(source: str) -> types.ModuleType:
    """The spec module at `source` ("REV:PATH", read with git show), as a module."""
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", source], check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType("cron_bench_before")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(text, f"<{source}>", "exec"), module.__dict__)
    return module


def transitions(zone: str) -> list[int]:
    """The zone's UTC offset changes in [FROM_MS, TO_MS), epoch ms (bisected to 1 s)."""
    tz, out, step = ZoneInfo(zone), [], 21_600
    for t in range(FROM_MS // 1000, TO_MS // 1000, step):
        before = datetime.fromtimestamp(t, tz).utcoffset()
        if datetime.fromtimestamp(t + step, tz).utcoffset() == before:
            continue
        lo, hi = t, t + step
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (
                (mid, hi) if datetime.fromtimestamp(mid, tz).utcoffset() == before else (lo, mid)
            )
        out.append(hi * 1000)
    return out


def instants(zone: str, count: int, rng: random.Random) -> list[tuple[str, int]]:
    """`count` (kind, epoch ms): "uniform" over the span, or "dst" near a transition."""
    near = transitions(zone)
    out = []
    for i in range(count):
        if i % 2 == 0 or not near:
            out.append(("uniform", rng.randrange(FROM_MS, TO_MS)))
        else:
            reach = 90_000 if i % 3 == 0 else 2 * HOUR_MS
            out.append(("dst", rng.choice(near) + rng.randrange(-reach, reach)))
    return out


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter_ns()
    answer = call()
    return (time.perf_counter_ns() - started) / 1000, answer


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(max(values), 1),
        "mean": round(sum(values) / len(values), 1),
    }


def measure(
    cron: str,
    zone: str,
    points: list[tuple[str, int]],
    before: types.ModuleType | None,
    before_count: int,
    quarter_ms: int,
) -> tuple[dict[str, Any], Costs]:
    """Time both versions on the same instants, alternating which goes first."""
    versions: dict[str, Any] = {"after": after_spec}
    if before is not None:
        versions["before"] = before
    specs = {name: m.ScheduleSpec(cron=cron, timezone=zone) for name, m in versions.items()}
    for name, m in versions.items():  # warm the caches (parsed cron, zone) off the clock
        m.next_fire(specs[name], FROM_MS)
    costs: Costs = {
        name: {call: {"uniform": [], "dst": []} for call in ("next_fire", "plan_fires")}
        for name in versions
    }
    differ = 0
    for i, (kind, at) in enumerate(points):
        following = after_spec.next_fire(specs["after"], at)
        assert following is not None
        until = following + quarter_ms
        names = [n for n in versions if n == "after" or i < before_count]
        if i % 2:
            names.reverse()
        answers: dict[str, Any] = {}
        for name in names:
            m, spec = versions[name], specs[name]
            cost, found = timed(partial(m.next_fire, spec, at))
            costs[name]["next_fire"][kind].append(cost)
            cost, planned = timed(partial(m.plan_fires, spec, at, until, MAX_FIRES_PER_CALL))
            costs[name]["plan_fires"][kind].append(cost)
            answers[name] = (found, planned)
        if len(answers) == 2 and answers["after"] != answers["before"]:
            differ += 1
    return {"differ": differ, **summarised(costs)}, costs


Costs = dict[str, dict[str, dict[str, list[float]]]]
"""Microseconds by version ("after", "before"), call, and kind of instant."""


def summarised(costs: Costs) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, calls in costs.items():
        out[name] = {
            call: {
                "all": stats(kinds["uniform"] + kinds["dst"]),
                "uniform": stats(kinds["uniform"]),
                "dst": stats(kinds["dst"]),
            }
            for call, kinds in calls.items()
        }
        uniform = calls["plan_fires"]["uniform"]
        out[name]["schedules_per_s"] = round(1e6 / (sum(uniform) / len(uniform))) if uniform else 0
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    before = None if args.no_before else load_before(args.before)
    quarter_ms = Settings().plan_horizon_ms // 4
    shapes: dict[str, Any] = {}
    for shape, cron in SHAPES.items():
        per_zone: dict[str, Any] = {}
        raw: list[Costs] = []
        for zone in ZONES:
            points = instants(zone, args.samples, rng)
            count = args.before_slow if shape == "per-second" else args.samples
            gc.collect()
            result, costs = measure(cron, zone, points, before, count, quarter_ms)
            per_zone[zone] = result
            raw.append(costs)
            print(f"  {shape:<10} {zone:<20} {line(result)}", flush=True)
        differ = sum(r["differ"] for r in per_zone.values())
        shapes[shape] = {
            "cron": cron,
            "differ": differ,
            **summarised(pooled(raw)),
            "zones": per_zone,
        }
    return {
        "shapes": shapes,
        "params": {
            "samples_per_zone": args.samples,
            "before_samples_per_zone_per_second_cron": args.before_slow,
            "before": None if args.no_before else args.before,
            "plan_horizon_ms": Settings().plan_horizon_ms,
            "max_fires_per_call": MAX_FIRES_PER_CALL,
            "seed": args.seed,
            "python": platform.python_version(),
            "croniter": importlib.metadata.version("croniter"),
        },
    }


def pooled(rows: list[Costs]) -> Costs:
    """One shape's samples over all zones."""
    out: Costs = {}
    for costs in rows:
        for name, calls in costs.items():
            for call, kinds in calls.items():
                for kind, values in kinds.items():
                    out.setdefault(name, {}).setdefault(call, {}).setdefault(kind, []).extend(
                        values
                    )
    return out


def fmt(cell: dict[str, float]) -> str:
    return f"{cell['p50']:,.0f} / {cell['p99']:,.0f} / {cell['max']:,.0f}"


def line(result: dict[str, Any]) -> str:
    after = result["after"]
    text = (
        f"after: next {fmt(after['next_fire']['all'])} us, plan {fmt(after['plan_fires']['all'])}"
        f" us, {after['schedules_per_s']:,}/s"
    )
    if "before" in result:
        before = result["before"]
        text += (
            f" | before: next {fmt(before['next_fire']['all'])} us, plan "
            f"{fmt(before['plan_fires']['all'])} us, {before['schedules_per_s']:,}/s"
            f" | differ {result['differ']}"
        )
    return text


def table(shapes: dict[str, Any]) -> str:
    rows = [
        "| cron | next_fire p50 / p99 / max (us) | plan_fires p50 / p99 / max (us) "
        "| schedules/s per planner pass |",
        "|---|---|---|---|",
    ]
    for shape, entry in shapes.items():
        a, b = entry["after"], entry.get("before")
        cells = [f"{shape} `{entry['cron']}`"]
        for call in ("next_fire", "plan_fires"):
            cell = fmt(a[call]["all"])
            cells.append(f"{fmt(b[call]['all'])} → **{cell}**" if b else cell)
        speed = f"{a['schedules_per_s']:,}"
        cells.append(f"{b['schedules_per_s']:,} → **{speed}**" if b else speed)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200, help="instants per cron and zone")
    parser.add_argument(
        "--before-slow",
        type=int,
        default=25,
        help="instants per zone the --before version is timed on for the per-second cron",
    )
    parser.add_argument(
        "--before",
        default="c43d3a0:timewheel/schedules/spec.py",
        help="REV:PATH of the version to compare with (git show)",
    )
    parser.add_argument("--no-before", action="store_true", help="time this tree's only")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="40 instants, 2 slow ones")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.samples, args.before_slow = 40, 2
    started = time.perf_counter()
    result = run(args)
    result["seconds"] = round(time.perf_counter() - started, 1)
    print()
    print(table(result["shapes"]))
    after = {shape: e["after"] for shape, e in result["shapes"].items()}
    worst = max(after, key=lambda shape: after[shape]["next_fire"]["all"]["p99"])
    second = result["shapes"]["per-second"]
    summary = (
        f"SUMMARY cron fire times: next_fire p99 at most "
        f"{after[worst]['next_fire']['all']['p99']:,.0f} us ({worst}), max "
        f"{max(a['next_fire']['all']['max'] for a in after.values()):,.0f} us; one planner pass "
        f"sustains {second['after']['schedules_per_s']:,} per-second schedules/s"
    )
    print(summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
