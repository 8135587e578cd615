"""CPU of one single create in the engine path: `Engine.create` one task per call, in a
closed loop on one connection, against a fresh redis-server (AOF appendfsync always).

The figure is this process's CPU (user + sys, `time.process_time`) per create: what the
Python side of a create costs (validation, ids, argument packing, the FCALL round trip's
socket work, reply decoding), without Redis's time, which runs in its own process. The
wall-clock rate is printed too but depends on fsync and on the shared cores.

Waiting for each fsync (appendfsync always) leaves the process idle about a millisecond
per create, and a process woken that often on a busy host runs with cold caches: the
same code costs less CPU with `--appendfsync no`, which shows the code path alone.

With `--caps ab` the rounds alternate between creates without a cap and creates that
carry the tenant's max_pending cap (the api's path: `Limiter.cap` in Python, the cap
checked in lua/task_create.lua), and Redis's time per create (`INFO commandstats`,
FCALL usec_per_call) is printed beside the caller's CPU: the cost of the exact limit.

With `--unix` the engine connects over the server's Unix socket instead of loopback TCP.

With `--callgrind` the bench runs again under valgrind's callgrind, instrumented only
while a round's creates run, and prints the instructions this process executed per
create: the Python side's work in user space (the kernel's socket work is not counted),
which, unlike CPU time, the host's load does not change (an A/B of two checkouts through
PYTHONPATH compares their code exactly).

Run:  .venv/bin/python bench/engine_create.py                 (3 rounds of 5,000 creates)
      .venv/bin/python bench/engine_create.py --caps ab --rounds 6   (A/B, interleaved)
      .venv/bin/python bench/engine_create.py --profile out.prof   (cProfile one round)
      .venv/bin/python bench/engine_create.py --callgrind --uvloop --unix --creates 2000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import CallgrindControl

from timewheel.config import Settings
from timewheel.engine import Engine, NewTask
from timewheel.limits import Limiter, Usage
from timewheel.store.server import RedisServer
from timewheel.tasks.creates import CapOf
from timewheel.tenants import Limits, Tenant

RESULTS = Path(__file__).resolve().parent / "results" / "engine_create.json"
TARGET_US = 60.0
PAYLOAD = '"' + "x" * 98 + '"'  # a JSON string of 100 bytes


async def fcall_us(engine: Engine) -> float:
    """Redis's mean time per FCALL since the last CONFIG RESETSTAT."""
    stats = await engine.client.info("commandstats")
    return float(stats.get("cmdstat_fcall", {}).get("usec_per_call", 0.0))


async def rounds(
    url: str,
    rounds: int,
    creates: int,
    profile: Path | None,
    caps_mode: str,
    callgrind: CallgrindControl | None = None,
) -> list[Any]:
    engine = await Engine.connect(Settings(redis_url=url))
    out: list[Any] = []
    limiter = Limiter(engine.store)
    tenant = Tenant("bench", Limits(max_pending=100_000_000), 0)
    try:
        new = NewTask(tenant="bench", payload_json=PAYLOAD, delay_ms=60_000)
        await limiter.check(tenant, Usage(runs=1))  # reads the tenant's usage once
        for _ in range(200):  # warm up: the library loads, the guard reads INFO
            await engine.tasks.create(new, caps=limiter.cap)
        for r in range(rounds):
            capped = caps_mode == "on" or (caps_mode == "ab" and r % 2 == 1)
            caps: CapOf | None = limiter.cap if capped else None
            prof = cProfile.Profile() if profile is not None and r == 0 else None
            await engine.client.config_resetstat()
            if callgrind is not None:
                callgrind.start()
            cpu, wall = time.process_time(), time.perf_counter()
            if prof is not None:
                prof.enable()
            for _ in range(creates):
                await engine.tasks.create(new, caps=caps)
            if prof is not None:
                prof.disable()
                assert profile is not None
                prof.dump_stats(str(profile))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            counted = callgrind.instructions(f"round-{r + 1}") if callgrind is not None else None
            out.append(
                {
                    "creates": creates,
                    "caps": capped,
                    "cpu_us_per_create": round(cpu * 1e6 / creates, 1),
                    "redis_us_per_create": round(await fcall_us(engine), 2),
                    "creates_per_s": round(creates / wall),
                    "profiled": prof is not None,
                }
            )
            if counted is not None:
                out[-1]["instructions_per_create"] = round(counted / creates)
            print(
                f"round {r + 1} ({'caps' if capped else 'no caps'}): "
                f"{out[-1]['cpu_us_per_create']} us CPU per create, "
                f"Redis {out[-1]['redis_us_per_create']} us per FCALL, "
                f"{out[-1]['creates_per_s']:,} creates/s{' (profiled)' if prof else ''}"
                + (
                    f", {out[-1]['instructions_per_create']:,} instructions per create"
                    if counted is not None
                    else ""
                ),
                flush=True,
            )
    finally:
        await engine.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--creates", type=int, default=5000)
    parser.add_argument("--profile", type=Path, help="cProfile the first round into this file")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--appendfsync", default="always", choices=("always", "everysec", "no"))
    parser.add_argument("--uvloop", action="store_true", help="run on uvloop (as the api does)")
    parser.add_argument(
        "--unix", action="store_true", help="connect over the server's Unix socket, not TCP"
    )
    parser.add_argument(
        "--caps",
        default="off",
        choices=("off", "on", "ab"),
        help="creates carry the tenant's max_pending cap: never, always, every other round",
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="count this process's instructions per create under valgrind's callgrind",
    )
    parser.add_argument("--callgrind-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.callgrind and args.callgrind_dir is None:
        return under_callgrind()
    callgrind = (
        CallgrindControl(args.callgrind_dir, os.getpid())
        if args.callgrind_dir is not None
        else None
    )
    with (
        tempfile.TemporaryDirectory(prefix="tw-bench-engine-") as tmp,
        RedisServer(
            Path(tmp) / "redis", appendfsync=args.appendfsync, unix_socket=args.unix
        ) as server,
    ):
        url = server.local_url if args.unix else server.url
        main = rounds(url, args.rounds, args.creates, args.profile, args.caps, callgrind)
        if args.uvloop:
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                results = runner.run(main)
        else:
            results = asyncio.run(main)
    plain = [r["cpu_us_per_create"] for r in results if not r["profiled"]]
    best = min(plain) if plain else None
    print(f"best {best} us CPU per create; target <= {TARGET_US} us", flush=True)
    out: dict[str, Any] = {
        "bench": "engine_create",
        "python": sys.version.split()[0],
        "appendfsync": args.appendfsync,
        "loop": "uvloop" if args.uvloop else "asyncio",
        "connection": "unix socket" if args.unix else "tcp loopback",
        "caps": args.caps,
        "target_cpu_us": TARGET_US,
        "best_cpu_us": best,
    }
    counts = [r["instructions_per_create"] for r in results if "instructions_per_create" in r]
    if counts:
        out["instructions_per_create"] = sorted(counts)
        print(f"instructions per create: {sorted(counts)}", flush=True)
    for label, capped in (("no_caps", False), ("caps", True)):
        rows = [r for r in results if r["caps"] is capped and not r["profiled"]]
        if rows and args.caps == "ab":
            out[label] = {
                "cpu_us_per_create": sorted(r["cpu_us_per_create"] for r in rows),
                "redis_us_per_create": sorted(r["redis_us_per_create"] for r in rows),
            }
            print(
                f"{label}: CPU {out[label]['cpu_us_per_create']} us, "
                f"Redis {out[label]['redis_us_per_create']} us per create",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**out, "rounds": results}, indent=2) + "\n")
    return 0


def under_callgrind() -> int:
    """This bench again, with the same arguments, in valgrind's callgrind (instrumented
    only while the creates run: Callgrind)."""
    if shutil.which("valgrind") is None:
        print("valgrind not found (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tw-bench-cg-") as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={tmp}/cg.%p",
            sys.executable,
            *sys.argv,
            "--callgrind-dir",
            tmp,
        ]
        return subprocess.run(command, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
