"""Redis's time per run in run_ack and in run_fail's retry path, from INFO commandstats.

A fresh redis-server (AOF appendfsync always), 64 shards, ONE tenant spread over 16
shards, 100-byte payloads, as bench/worker.py. Two sets of `runs` runs are created
together, in turns (so the records of both lie alike in every body hash: a set created
after the other would sit behind it in each hash, and its every HGET and HSET walk
further), the ack set due now and the fail set a minute later. Each set in its turn is
dispatched by ticking every shard, read by XREADGROUP in a consumer group, then reported
in batches of `batch` deliveries mixed over the tenant's 16 streams (as a worker's acks
come back; the default, 1,024, is a worker's full ack pipeline, ACK_BATCH: one call of 64
runs per shard, ACK_PER_CALL, the call a draining worker makes): the first acked, the
second failed with retries left. Only those calls run while commandstats is sampled, so
FCALL's microseconds per run are the call's, nested commands included; the nested
commands are listed too.

The batches go the way the code under PYTHONPATH sends them: `Outcomes.ack_many`, and
`Outcomes.fail_many` where it exists, else one `Outcomes.fail` per run (all at once, one
round trip each). So with PYTHONPATH set to another checkout it measures that checkout's
scripts and calls (an A/B comparison).

With --callgrind the server runs under valgrind's callgrind, instrumented only while the
batches go, and each part also reports the instructions per run that Redis executed in
FCALL (nested commands included) and in all: a count the host's load does not change, for
A/B comparisons on a shared machine (slow: use a few thousand runs). The ticks that
dispatch each set of runs are counted too ("tick", "tick-2").

Run:  .venv/bin/python bench/outcomes.py [--runs 20000] [--batch 1024] [--out FILE]
          [--callgrind]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from common import CallgrindControl, dumped_part
from dispatch import payload_json, server_ms

import timewheel.store.server as server_module
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.runs.delivery import Delivery, parse_entry
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

RESULTS = Path(__file__).resolve().parent / "results" / "outcomes.json"
SHARDS, SPREAD, TENANT, GROUP = 64, 16, "bench", "timewheel"
DEFAULT_BATCH = 1024
"""A worker's full ack pipeline (timewheel.runs.acks.ACK_BATCH, not imported so that an
older checkout under PYTHONPATH can be measured too)."""


async def command_usec(client: aioredis.Redis) -> dict[str, tuple[float, float]]:
    """Per command: microseconds and calls so far (INFO commandstats); and Redis's CPU
    seconds (user + sys, INFO cpu) as "cpu"."""
    stats: dict[str, Any] = await client.info("commandstats")
    cpu: dict[str, Any] = await client.info("cpu")
    out = {
        k.removeprefix("cmdstat_"): (float(v["usec"]), float(v["calls"])) for k, v in stats.items()
    }
    out["cpu"] = ((float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6, 0.0)
    return out


def share(
    before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], runs: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (usec, calls) in after.items():
        b_usec, b_calls = before.get(name, (0.0, 0.0))
        if usec - b_usec > 0:
            out[name] = {
                "us_per_run": round((usec - b_usec) / runs, 2),
                "calls_per_run": round((calls - b_calls) / runs, 3),
            }
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us_per_run"]))


async def dispatch_all(
    engine: Engine, now_ms: int, runs: int, callgrind: Callgrind | None, part: str
) -> int:
    """Promote, then tick every shard until nothing is due at now_ms; returns the runs
    dispatched. With callgrind, the ticks are counted as `part`."""
    for shard in range(SHARDS):
        # (runs made before any promoter pass wait in distant buckets: several calls)
        while (await engine.dispatch.promote(shard, now_ms=now_ms)).more:
            pass
    if callgrind is not None:
        callgrind.start()
    total = 0
    for shard in range(SHARDS):
        while (n := (await engine.dispatch.tick(shard, now_ms=now_ms)).dispatched) > 0:
            total += n
    if callgrind is not None:
        callgrind.counted[part] = callgrind.stop(part, runs)
    return total


SET_GAP_MS = 60_000
"""The fail set is due this much after the ack set (created together, dispatched apart)."""


async def created(engine: Engine, runs: int) -> int:
    """Two sets of `runs` runs made together, one after the other in turns: the ack set
    due now, the fail set SET_GAP_MS later. Made in turns, the records of both lie alike
    in every body hash (runs made after the others would sit behind them in each hash,
    and every HGET and HSET of theirs walk further). Returns the ack set's due time."""
    client = engine.client
    assert isinstance(client, aioredis.Redis)
    now = await server_ms(client)
    for start in range(0, 2 * runs, 1000):
        batch = [
            NewTask(
                tenant=TENANT, payload_json=payload_json(i), run_at_ms=now + (i % 2) * SET_GAP_MS
            )
            for i in range(start, min(2 * runs, start + 1000))
        ]
        await engine.tasks.create_many(batch)
    return now


async def dispatched(
    engine: Engine, due_ms: int, runs: int, callgrind: Callgrind | None, part: str
) -> list[Delivery]:
    """The `runs` runs due by due_ms, dispatched, and read in the consumer group
    (shuffled, as acks come back from a worker reading 16 streams). With callgrind, the
    ticks that dispatch them are counted as `part` (callgrind.counted)."""
    client = engine.client
    assert isinstance(client, aioredis.Redis)
    total = await dispatch_all(engine, due_ms + 10, runs, callgrind, part)
    out: list[Delivery] = []
    for shard in engine.store.shards_of(TENANT):
        stream = engine.keys.stream(shard, TENANT, "default")
        await engine.outcomes.register_group(stream, GROUP)
        while True:
            reply: Any = await client.xreadgroup(GROUP, "bench", {stream: ">"}, count=5000)
            if not reply:
                break
            for name, entries in reply:
                out.extend(parse_entry(name.decode(), eid, f) for eid, f in entries)
    if len(out) != runs:
        raise RuntimeError(f"read {len(out)} of {runs} runs ({total} dispatched)")
    random.Random(7).shuffle(out)
    return out


class Callgrind(CallgrindControl):
    """callgrind_control on the server's process: count only while a part runs."""

    def __init__(self, out_dir: Path) -> None:
        super().__init__(out_dir)
        self.counted: dict[str, dict[str, float]] = {}
        """Parts counted outside report()'s own (the ticks), by name."""

    def wrapper(self) -> str:
        """A redis-server that starts under callgrind, uninstrumented."""
        script = self.out_dir / "redis-server-callgrind"
        script.write_text(
            "#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no --dump-instr=no "
            f"--callgrind-out-file={self.out_dir}/cg.%p {server_module.redis_server_binary()} "
            '"$@"\n'
        )
        script.chmod(0o755)
        return str(script)

    def stop(self, part: str, runs: int) -> dict[str, float]:
        """Instructions per run since start(): in FCALL and in all."""
        dump = self.dump(part)
        text = subprocess.run(
            ["callgrind_annotate", "--auto=no", "--inclusive=yes", "--threshold=100", str(dump)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        out: dict[str, float] = {}
        for name, pattern in (("fcall", r":fcallCommand "), ("total", r"PROGRAM TOTALS")):
            m = re.search(r"^\s*([\d,]+) .*" + pattern, text, re.MULTILINE)
            out[name] = round(int(m.group(1).replace(",", "")) / runs) if m else 0.0
        return out


async def report(
    url: str, runs: int, batch: int, callgrind: Callgrind | None = None
) -> dict[str, Any]:
    settings = Settings(redis_url=url, prefix="ob", shards=SHARDS, default_spread=SPREAD)
    engine = await Engine.connect(settings)
    client = engine.client
    assert isinstance(client, aioredis.Redis)
    outcomes = engine.outcomes
    result: dict[str, Any] = {"runs": runs, "batch": batch}
    try:
        await engine.store.scripts.library.load(client)
        if callgrind is not None:
            callgrind.pid = int((await client.info("server"))["process_id"])
        due = await created(engine, runs)
        acks = await dispatched(engine, due, runs, callgrind, "tick")
        if callgrind is not None:
            callgrind.start()
        before, t0 = await command_usec(client), time.perf_counter()
        acked = 0
        for i in range(0, runs, batch):
            acked += sum(await outcomes.ack_many(acks[i : i + batch], GROUP))
        seconds, after = time.perf_counter() - t0, await command_usec(client)
        result["ack"] = {
            "acked": acked,
            "seconds": round(seconds, 2),
            "commands": share(before, after, runs),
        }
        if callgrind is not None:
            result["ack"]["instructions_per_run"] = callgrind.stop("ack", runs)

        fails = await dispatched(engine, due + SET_GAP_MS, runs, callgrind, "tick-2")
        many = getattr(outcomes, "fail_many", None)
        if callgrind is not None:
            callgrind.start()
        before, t0 = await command_usec(client), time.perf_counter()
        retried = 0
        for i in range(0, runs, batch):
            chunk = fails[i : i + batch]
            if many is not None:
                from timewheel.runs.outcomes import Failure

                results = await many([Failure(d, "RuntimeError: bench") for d in chunk], GROUP)
            else:
                results = await asyncio.gather(
                    *(outcomes.fail(d, GROUP, "RuntimeError: bench") for d in chunk)
                )
            retried += sum(1 for r in results if r.outcome == "retry")
        seconds, after = time.perf_counter() - t0, await command_usec(client)
        result["fail"] = {
            "retried": retried,
            "seconds": round(seconds, 2),
            "commands": share(before, after, runs),
        }
        if callgrind is not None:
            result["fail"]["instructions_per_run"] = callgrind.stop("fail", runs)
            result["tick"] = {"instructions_per_run": callgrind.counted}
    finally:
        await engine.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--callgrind", action="store_true", help=__doc__.split("\n\n")[2])
    parser.add_argument(
        "--redis-config",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a redis.conf setting over the recommended ones (repeatable; for A/B runs)",
    )
    parser.add_argument(
        "--dumps",
        type=Path,
        default=None,
        help="with --callgrind, copy each part's callgrind dump here (for callgrind_annotate)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        callgrind = None
        if args.callgrind:
            callgrind = Callgrind(Path(tmp))
            wrapped = callgrind.wrapper()
            server_module.redis_server_binary = lambda: wrapped
        extra = dict(kv.split("=", 1) for kv in args.redis_config)
        server = RedisServer(Path(tmp) / "redis", appendfsync="always", extra_config=extra)
        server.start(timeout_s=120)
        try:
            result = asyncio.run(report(server.url, args.runs, args.batch, callgrind))
        finally:
            server.stop()
            if callgrind is not None and args.dumps is not None:
                args.dumps.mkdir(parents=True, exist_ok=True)
                for dump in Path(tmp).glob("cg.*"):
                    shutil.copy(dump, args.dumps / f"{dumped_part(dump) or 'rest'}-{dump.name}")
            shutil.rmtree(tmp, ignore_errors=True)
    result["callgrind"] = args.callgrind
    result["redis_config"] = args.redis_config
    for part, ins in result.get("tick", {}).get("instructions_per_run", {}).items():
        print(
            f"{part} (dispatching the runs): instructions per run: FCALL {ins['fcall']:.0f}, "
            f"Redis in all {ins['total']:.0f}",
            flush=True,
        )
    for part, counted in (("ack", "acked"), ("fail", "retried")):
        r = result[part]
        if args.callgrind:
            ins = r["instructions_per_run"]
            print(
                f"{part}: instructions per run: FCALL {ins['fcall']:.0f}, "
                f"Redis in all {ins['total']:.0f}",
                flush=True,
            )
        fcall = r["commands"].get("fcall", {}).get("us_per_run")
        calls = r["commands"].get("fcall", {}).get("calls_per_run")
        print(
            f"{part}: FCALL {fcall} us/run ({calls} calls/run), Redis CPU "
            f"{r['commands']['cpu']['us_per_run']} us/run, {r[counted]}/{args.runs} {counted}, "
            f"{r['seconds']} s; nested: "
            + ", ".join(
                f"{k} {v['us_per_run']}"
                for k, v in r["commands"].items()
                if k not in ("fcall", "cpu")
            ),
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
