"""Redis bytes per pending task, for our wheel and for the layouts we weighed it against.

Each layout gets a fresh redis-server (AOF on, appendfsync everysec to load quickly,
automatic AOF rewrites off so no fork runs during a measurement). N tasks with a
100-byte JSON payload are loaded; the figure is INFO memory used_memory after minus
before, divided by N (used_memory_dataset likewise). The per-shard event-log streams
are capped (settings.event_log_max), a constant whatever N is, so they are measured
apart and bytes/task is shown with and without them. Key classes are sized by sampling
MEMORY USAGE (SAMPLES 0) and OBJECT ENCODING.

Ours is loaded with the FCALL calls Engine.create_many pipelines (Engine._prepare
builds them: same script, keys, arguments), sent on a plain pipelined connection
(`--loader engine` uses Engine.create_many itself: same bytes, ~2x slower here).

Layouts (the default set is all but wheel-far-1h):
  wheel-far               ours, run_at uniform over the next 7 days: far buckets (w:)
  wheel-near              ours, all due within the horizon after a promote: near ZSETs
  wheel-default-listpack  as wheel-far on Redis defaults (listpack entries 128 / value 64)
  wheel-far-1h            as wheel-far with 1 h buckets (~90 runs per bucket, what 60 s
                          buckets hold at 50 M tasks): the bucket sizing effect
  hash-per-task           naive (BullMQ-like): a HASH per task + a ZSET per shard by due
  one-hash-per-shard      a HASH per shard id -> packed record + a ZSET per shard by due

Run:  .venv/bin/python bench/memory.py            (1,000,000 tasks, ~5.5 min on 2 cores)
      .venv/bin/python bench/memory.py --quick    (100,000 tasks)
      .venv/bin/python bench/memory.py --layouts wheel-far-1h --out /tmp/m.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from rawpipe import RawPipe, resp

from timewheel import ids
from timewheel.config import Settings
from timewheel.engine import Engine
from timewheel.store import record
from timewheel.store.server import RedisServer
from timewheel.tasks.model import NewTask

DAY_MS = 86_400_000
NEAR_SPREAD_MS = max(1, min(58_000, Settings().horizon_ms - 2_000))
PAYLOAD_BYTES = 100
SPREAD_DAYS = 7
SHARDS = 64
TENANTS = 1000
QUEUE = "default"
RESULTS = Path(__file__).resolve().parent / "results" / "memory.json"
LAYOUT_TIMEOUT_S = 240.0
"""Per layout at 1M tasks; larger runs get time in proportion (loads go at ~10k/s)."""
DEFAULT_LISTPACK = {"hash-max-listpack-entries": "128", "hash-max-listpack-value": "64"}
BASE_CONFIG = {"auto-aof-rewrite-percentage": "0"}
LENGTH_COMMAND = {
    "hash": "HLEN",
    "zset": "ZCARD",
    "stream": "XLEN",
    "set": "SCARD",
    "list": "LLEN",
    "string": "STRLEN",
}


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    kind: str  # "wheel" | "hash-per-task" | "one-hash-per-shard"
    doc: str
    near: bool = False
    bucket_ms: int = Settings().bucket_ms
    extra_config: dict[str, str] = field(default_factory=dict)


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout("wheel-far", "wheel", "ours: far buckets, run_at over the next 7 days"),
        Layout("wheel-near", "wheel", "ours: all due within the horizon, near ZSETs", near=True),
        Layout(
            "wheel-default-listpack",
            "wheel",
            "wheel-far on Redis default listpack limits (128 entries / 64 B values)",
            extra_config=DEFAULT_LISTPACK,
        ),
        Layout(
            "wheel-far-1h",
            "wheel",
            "wheel-far with 1 h buckets (fuller buckets: what 10 min buckets hold at 6 M tasks)",
            bucket_ms=3_600_000,
        ),
        Layout("hash-per-task", "hash-per-task", "naive: HASH per task + ZSET per shard"),
        Layout(
            "one-hash-per-shard",
            "one-hash-per-shard",
            "HASH per shard id -> packed record + ZSET per shard",
        ),
    )
}


DEFAULT_LAYOUTS = [name for name in LAYOUTS if name != "wheel-far-1h"]


# -- workload ------------------------------------------------------------------------


_PAD = "x" * (PAYLOAD_BYTES - len('"task-0000000000-"'))


def payload_json(i: int) -> str:
    """A JSON string whose encoded JSON is exactly PAYLOAD_BYTES bytes (for i < 10**10)."""
    return f'"task-{i:010d}-{_PAD}"'


def tenant_names(count: int) -> list[str]:
    return [f"tenant-{i:04d}" for i in range(count)]


@dataclass(slots=True)
class Workload:
    """Which task i is: tenant, due time, payload. Deterministic for a seed."""

    tasks: int
    tenants: list[str]
    now_ms: int
    near: bool
    spread_ms: int = SPREAD_DAYS * DAY_MS
    seed: int = 1
    rng: random.Random = field(init=False)
    shard_of: dict[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.shard_of = {t: ids.tenant_shards(t, 1, SHARDS)[0] for t in self.tenants}

    def due_ms(self) -> int:
        if self.near:  # due within the horizon of a promote made at now_ms
            return self.now_ms + 1_000 + self.rng.randrange(NEAR_SPREAD_MS)
        return self.now_ms + self.rng.randrange(self.spread_ms)

    def items(self) -> Iterator[tuple[int, str, int, str]]:
        """(i, tenant, due_ms, payload_json) for every task."""
        n_tenants = len(self.tenants)
        for i in range(self.tasks):
            yield i, self.tenants[i % n_tenants], self.due_ms(), payload_json(i)


def batches(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


async def run_pipelined(
    chunks: Iterator[list[Any]],
    send: Callable[[list[Any]], Coroutine[Any, Any, None]],
    inflight: int,
) -> None:
    """Send batches with up to `inflight` in flight, so Python builds one while Redis runs one."""
    pending: set[asyncio.Task[None]] = set()
    for chunk in chunks:
        if len(pending) >= inflight:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        pending.add(asyncio.create_task(send(chunk)))
    if pending:
        await asyncio.gather(*pending)


def packed_record(due_ms: int, tenant: str, created_ms: int, payload: str) -> bytes:
    """The record as lua/lib/record.lua packs it."""
    return record.pack_fresh(due_ms, tenant, QUEUE, created_ms, payload)


# -- loaders ---------------------------------------------------------------------------


async def prepare_wheel(url: str, layout: Layout) -> None:
    """What a running deployment holds before its first task: the layout record and the
    Function library (Engine.connect, then the library's load)."""
    settings = Settings(redis_url=url, shards=SHARDS, bucket_ms=layout.bucket_ms)
    engine = await Engine.connect(settings)
    try:
        await engine.store.scripts.library.load(engine.client)
    finally:
        await engine.close()


async def load_wheel(url: str, layout: Layout, work: Workload, args: argparse.Namespace) -> None:
    """Our layout: every task made by lua/task_create.lua with the arguments Engine builds."""
    settings = Settings(redis_url=url, shards=SHARDS, bucket_ms=layout.bucket_ms)
    engine = await Engine.connect(settings)
    try:
        await engine.store.scripts.library.load(engine.client)  # no load-on-miss in the pipelines
        if layout.near:
            for shard in range(SHARDS):
                while (await engine.dispatch.promote(shard, now_ms=work.now_ms)).more:
                    pass
        if args.loader == "engine":
            await _create_with_engine(engine, work, args.batch, args.inflight)
        else:
            await load_raw(url, _create_raw(engine, work, args.batch, args.caps))
    finally:
        await engine.close()


async def _create_with_engine(engine: Engine, work: Workload, batch: int, inflight: int) -> None:
    async def send(chunk: list[tuple[int, str, int, str]]) -> None:
        news = [NewTask(tenant=t, payload_json=p, run_at_ms=due) for _, t, due, p in chunk]
        results = await engine.tasks.create_many(news)
        if not all(r.created for r in results):
            raise RuntimeError("a create was not a new task")

    await run_pipelined(batches(work.items(), batch), send, inflight)


def _never_reached(tenant: str, shard: int) -> int:
    """A max_pending cap no load reaches: the create calls check it (lua/task_create.lua)."""
    return 1 << 50


def _create_raw(
    engine: Engine, work: Workload, batch: int, capped: bool = False
) -> Iterator[list[bytes]]:
    """The FCALL calls Engine.create_many pipelines, same keys and arguments (built by
    Engine._prepare), as protocol bytes: the stored data is identical, and the load is
    not bound by redis-py's command packing (about 50 us a command on this machine)."""
    for chunk in batches(work.items(), batch):
        news = [
            NewTask(tenant=tenant, payload_json=payload, run_at_ms=due)
            for _, tenant, due, payload in chunk
        ]
        calls = engine.tasks.create_calls(
            [engine.tasks.prepare(new) for new in news], caps=_never_reached if capped else None
        )
        yield [resp(("FCALL", c.script.function, len(c.keys), *c.keys, *c.args)) for c in calls]


async def load_raw(url: str, command_batches: Iterator[list[bytes]]) -> None:
    pipe = await RawPipe.open(url)
    try:
        await pipe.run(command_batches)
    finally:
        await pipe.close()


def hash_per_task_commands(work: Workload, batch: int) -> Iterator[list[bytes]]:
    """A HASH per task (tenant, queue, run_at, payload, state, attempt) + a ZSET per shard."""
    for chunk in batches(work.items(), batch):
        commands = []
        zadds: dict[int, list[str | int]] = {}
        for _, tenant, due, payload in chunk:
            shard = work.shard_of[tenant]
            task_id = ids.make_task_id(shard, ids.new_token())
            commands.append(
                resp(
                    (
                        "HSET", f"{{hp:{shard}}}:job:{task_id}", "tenant", tenant,
                        "queue", QUEUE, "run_at", due, "payload", payload,
                        "state", "scheduled", "attempt", 0,
                    )
                )
            )  # fmt: skip
            zadds.setdefault(shard, []).extend((due, task_id))
        for shard, pairs in zadds.items():
            commands.append(resp(("ZADD", f"{{hp:{shard}}}:delayed", *pairs)))
        yield commands


def one_hash_per_shard_commands(work: Workload, batch: int) -> Iterator[list[bytes]]:
    """A HASH per shard, task id -> packed record, + a ZSET per shard, task id -> due."""
    for chunk in batches(work.items(), batch):
        records: dict[int, list[str | bytes]] = {}
        zadds: dict[int, list[str | int]] = {}
        for _, tenant, due, payload in chunk:
            shard = work.shard_of[tenant]
            task_id = ids.make_task_id(shard, ids.new_token())
            records.setdefault(shard, []).extend(
                (task_id, packed_record(due, tenant, work.now_ms, payload))
            )
            zadds.setdefault(shard, []).extend((due, task_id))
        commands = [resp(("HSET", f"{{hs:{s}}}:records", *kv)) for s, kv in records.items()]
        commands += [resp(("ZADD", f"{{hs:{s}}}:due", *kv)) for s, kv in zadds.items()]
        yield commands


# -- measuring -------------------------------------------------------------------------


async def memory_info(client: aioredis.Redis) -> dict[str, int]:
    info: dict[str, Any] = await client.info("memory")
    out = {k: int(info[k]) for k in ("used_memory", "used_memory_dataset")}
    # MEMORY STATS: the non-dataset parts a load may move (the library's compiled code,
    # client buffers) apart from the dataset.
    raw = await client.execute_command("MEMORY", "STATS")  # type: ignore[no-untyped-call]
    stats = raw if isinstance(raw, dict) else dict(zip(raw[::2], raw[1::2], strict=True))
    for name in (b"functions.caches", b"clients.normal", b"overhead.total"):
        value = stats.get(name, stats.get(name.decode()))
        if isinstance(value, int):
            out[name.decode().replace(".", "_")] = value
    return out


def key_class(key: str) -> str:
    """'t', 'w', 'near', 'events', 'job', ... : the part after the hash tag, up to ':'
    (a body hash of any level, 't:<xy>' or 't<level>:<chars>', is 't')."""
    rest = key.split("}:", 1)[1] if "}:" in key else key
    cls = rest.split(":", 1)[0]
    return "t" if cls[:1] == "t" and cls[1:].isdigit() else cls


async def scan_classes(client: aioredis.Redis) -> dict[str, list[str]]:
    classes: dict[str, list[str]] = {}
    async for raw in client.scan_iter(count=10_000):
        key = raw.decode()
        classes.setdefault(key_class(key), []).append(key)
    return classes


async def sample_class(
    client: aioredis.Redis, keys: list[str], sample: int, rng: random.Random
) -> dict[str, Any]:
    """Estimate a key class's bytes and entries from MEMORY USAGE of a sample."""
    picked = keys if len(keys) <= sample else rng.sample(keys, sample)
    pipe = client.pipeline(transaction=False)
    for key in picked:
        pipe.type(key)
        pipe.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0")
        pipe.object("encoding", key)
    replies = await pipe.execute()
    types = [_text(replies[i]) for i in range(0, len(replies), 3)]
    usage = [int(replies[i]) for i in range(1, len(replies), 3)]
    encodings = Counter(_text(replies[i]) for i in range(2, len(replies), 3))
    pipe = client.pipeline(transaction=False)
    for key, kind in zip(picked, types, strict=True):
        pipe.execute_command(LENGTH_COMMAND.get(kind, "EXISTS"), key)
    lengths = [int(x) for x in await pipe.execute()]
    scale = len(keys) / len(picked)
    return {
        "keys": len(keys),
        "sampled": len(picked),
        "type": Counter(types).most_common(1)[0][0],
        "bytes": round(sum(usage) * scale),
        "entries": round(sum(lengths) * scale),
        "bytes_per_key": round(sum(usage) / len(picked), 1),
        "entries_per_key": round(sum(lengths) / len(picked), 2),
        "max_entries_sampled": max(lengths),
        "encodings": dict(encodings),
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def breakdown(client: aioredis.Redis, sample: int, tasks: int) -> dict[str, dict[str, Any]]:
    rng = random.Random(7)
    out: dict[str, dict[str, Any]] = {}
    for name, keys in sorted((await scan_classes(client)).items()):
        if name == "events":  # few keys, each big: measure every one exactly
            info = await sample_class(client, keys, len(keys), rng)
        else:
            info = await sample_class(client, keys, sample, rng)
        info["bytes_per_task"] = round(info["bytes"] / tasks, 1)
        out[name] = info
    return out


async def record_size(client: aioredis.Redis, body_keys: list[str]) -> int | None:
    """Length of one stored task record (to check the packed-record layout matches ours)."""
    for key in body_keys[:10]:
        fields: list[bytes | str] = await client.hkeys(key)
        if fields:
            raw = await client.hget(key, fields[0])
            return None if raw is None else len(raw)
    return None


# -- one layout ------------------------------------------------------------------------


def public_config(server: RedisServer) -> dict[str, str]:
    skip = {"port", "bind", "dir", "logfile", "pidfile", "daemonize", "protected-mode"}
    return {k: v for k, v in server.config().items() if k not in skip}


async def measure(url: str, layout: Layout, args: argparse.Namespace) -> dict[str, Any]:
    client = aioredis.Redis.from_url(url)
    try:
        info: dict[str, Any] = await client.info("server")
        await client.hset("tw:layout", mapping={"shards": SHARDS, "bucket_ms": layout.bucket_ms})
        if layout.kind == "wheel":
            # A deployment's fixed cost, not the tasks': the Function library (about
            # 270 KB of compiled Lua, 2.7 B a task at 100,000) and the layout record.
            await prepare_wheel(url, layout)
        await client.config_resetstat()
        before = await memory_info(client)
        work = Workload(
            args.tasks,
            tenant_names(args.tenants),
            int(time.time() * 1000),
            layout.near,
            spread_ms=int(args.spread_s * 1000),
        )
        started = time.perf_counter()
        if layout.kind == "wheel":
            await load_wheel(url, layout, work, args)
        elif layout.kind == "hash-per-task":
            await load_raw(url, hash_per_task_commands(work, args.batch))
        else:
            await load_raw(url, one_hash_per_shard_commands(work, args.batch))
        load_s = time.perf_counter() - started
        after = await memory_info(client)
        stats: dict[str, Any] = await client.info("commandstats")
        parts = await breakdown(client, args.sample, args.tasks)
        body_keys = await _keys_of(client, "t") if layout.kind == "wheel" else []
        record = await record_size(client, body_keys) if body_keys else None
        # The event logs' memory exactly: what deleting them frees. MEMORY USAGE counts a
        # stream's listpacks by their bytes, not their allocations, which a log of large
        # entries (a batched create's names 2,000 runs) rounds up by several per cent.
        logs = [k async for k in client.scan_iter(match="{tw:*}:events", count=10_000)]
        without_logs = None
        if logs:
            for start in range(0, len(logs), 500):
                await client.delete(*logs[start : start + 500])
            without_logs = await memory_info(client)
        return {
            "layout": layout.name,
            "doc": layout.doc,
            "redis_version": info["redis_version"],
            "bucket_ms": layout.bucket_ms if layout.kind == "wheel" else None,
            "load_seconds": round(load_s, 2),
            "load_rate_per_s": round(args.tasks / load_s),
            "redis_command_usec": {
                k.removeprefix("cmdstat_"): v["usec_per_call"]
                for k, v in stats.items()
                if v.get("calls", 0) >= args.tasks // 100
            },
            # Redis's time in the create calls per task loaded (commands of the calls
            # are counted inside the FCALL too)
            "fcall_usec_per_task": round(
                stats.get("cmdstat_fcall", {}).get("usec", 0) / args.tasks, 2
            ),
            "before": before,
            "after": after,
            "after_event_logs_deleted": without_logs,
            "breakdown": parts,
            "record_bytes": record,
        }
    finally:
        await client.aclose()


async def _keys_of(client: aioredis.Redis, cls: str) -> list[str]:
    found = []
    pattern = "{tw:*}:t[0-9:]*" if cls == "t" else "{tw:*}:" + cls + ":*"  # key_class
    async for raw in client.scan_iter(match=pattern, count=10_000):
        found.append(raw.decode())
        if len(found) >= 10:
            break
    return found


def summarize(raw: dict[str, Any], tasks: int) -> dict[str, Any]:
    delta = raw["after"]["used_memory"] - raw["before"]["used_memory"]
    dataset = raw["after"]["used_memory_dataset"] - raw["before"]["used_memory_dataset"]
    estimated = raw["breakdown"].get("events", {}).get("bytes", 0)
    freed = raw.get("after_event_logs_deleted")
    events = raw["after"]["used_memory"] - freed["used_memory"] if freed else estimated
    attributed = sum(p["bytes"] for p in raw["breakdown"].values())
    raw.update(
        {
            "used_memory_delta": delta,
            "used_memory_dataset_delta": dataset,
            "event_log_bytes": events,
            "event_log_memory_usage": estimated,
            "bytes_per_task": round(delta / tasks, 1),
            "bytes_per_task_excl_event_log": round((delta - events) / tasks, 1),
            "dataset_bytes_per_task": round(dataset / tasks, 1),
            "dataset_bytes_per_task_excl_event_log": round((dataset - events) / tasks, 1),
            "memory_usage_sum": attributed,
            "unattributed_bytes": delta - attributed,
        }
    )
    return raw


def run_layout(layout: Layout, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    data_dir = root / layout.name
    config = {**BASE_CONFIG, **layout.extra_config}
    server = RedisServer(data_dir, port=0, appendfsync="everysec", extra_config=config)
    try:
        server.start()
        timeout_s = LAYOUT_TIMEOUT_S * max(1.0, args.tasks / 1_000_000)
        raw = asyncio.run(asyncio.wait_for(measure(server.url, layout, args), timeout_s))
        raw["config"] = public_config(server)
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return summarize(raw, args.tasks)


# -- output ----------------------------------------------------------------------------


def print_table(results: list[dict[str, Any]], tasks: int) -> None:
    head = (
        f"{'layout':<24}{'used Δ MB':>11}{'B/task':>9}{'excl.log':>10}"
        f"{'dataset':>9}{'ds excl.':>10}{'log MB':>9}{'load s':>8}{'k/s':>7}"
    )
    print(f"\nRedis bytes per pending task, {tasks:,} tasks, {PAYLOAD_BYTES} B payload")
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['layout']:<24}{r['used_memory_delta'] / 1e6:>11.1f}{r['bytes_per_task']:>9.1f}"
            f"{r['bytes_per_task_excl_event_log']:>10.1f}{r['dataset_bytes_per_task']:>9.1f}"
            f"{r['dataset_bytes_per_task_excl_event_log']:>10.1f}"
            f"{r['event_log_bytes'] / 1e6:>9.1f}{r['load_seconds']:>8.1f}"
            f"{r['load_rate_per_s'] / 1000:>7.1f}"
        )


def print_breakdowns(results: list[dict[str, Any]]) -> None:
    print("\nby key class (MEMORY USAGE SAMPLES 0 of a sample, scaled to the key count):")
    for r in results:
        rec = f", record {r['record_bytes']} B" if r.get("record_bytes") else ""
        print(f"  {r['layout']} (unattributed {r['unattributed_bytes'] / 1e6:.1f} MB{rec})")
        for name, p in sorted(r["breakdown"].items(), key=lambda kv: -int(kv[1]["bytes"])):
            encodings = ",".join(f"{k}:{v}" for k, v in sorted(p["encodings"].items()))
            print(
                f"    {name:<8}{p['type']:<7}{p['keys']:>9,} keys {p['bytes'] / 1e6:>9.1f} MB "
                f"{p['bytes_per_task']:>7.1f} B/task  {p['entries_per_key']:>9.2f} entries/key "
                f"(max {p['max_entries_sampled']})  [{encodings}]"
            )


def summary_line(results: list[dict[str, Any]], tasks: int) -> str:
    by = {r["layout"]: r for r in results}
    parts = [f"{name} {r['bytes_per_task_excl_event_log']:.0f}" for name, r in by.items()]
    log_mb = max((r["event_log_bytes"] for r in results), default=0) / 1e6
    line = (
        f"SUMMARY memory ({tasks:,} tasks, {PAYLOAD_BYTES} B payload): B/task excl. the "
        f"event log (constant {log_mb:.0f} MB): " + ", ".join(parts)
    )
    far = by.get("wheel-far")
    if far:
        fill = far["breakdown"].get("w", {}).get("entries_per_key", 0)
        # The log is a constant (capped per shard): at 50 M tasks it adds log / 50 M.
        at_50m = far["bytes_per_task_excl_event_log"] + far["event_log_bytes"] / 50e6
        verdict = "met" if at_50m <= 200 else "not met"
        line += (
            f"; wheel-far incl. log {far['bytes_per_task']:.0f} here, {at_50m:.0f} at 50 M "
            f"(target <= 200 B/task at 50 M tasks: {verdict}; far buckets hold {fill:.1f} "
            "runs here, ~77 at 50 M)"
        )
    return line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1_000_000, help="tasks per layout")
    parser.add_argument("--quick", action="store_true", help="100,000 tasks (smoke run)")
    parser.add_argument(
        "--layouts",
        default=",".join(DEFAULT_LAYOUTS),
        help=f"comma list of {', '.join(LAYOUTS)} (default: all but wheel-far-1h)",
    )
    parser.add_argument(
        "--loader",
        choices=("raw", "engine"),
        default="raw",
        help="how ours is loaded: the task_create.lua calls Engine builds streamed through "
        "a plain pipelined connection (default, fast), or Engine.create_many (redis-py)",
    )
    parser.add_argument(
        "--caps",
        action="store_true",
        help="the raw loader's create calls carry a max_pending cap per tenant (never reached)",
    )
    parser.add_argument(
        "--tenants", type=int, default=TENANTS, help="tenants the tasks go round (one shard each)"
    )
    parser.add_argument(
        "--spread-s",
        type=float,
        default=SPREAD_DAYS * DAY_MS / 1000,
        help="far-level due times spread uniformly over this many seconds from now "
        "(default 7 days; 600: one 10-minute bucket per shard)",
    )
    parser.add_argument("--batch", type=int, default=2000, help="tasks per pipeline")
    parser.add_argument("--inflight", type=int, default=3, help="engine pipelines in flight")
    parser.add_argument("--sample", type=int, default=3000, help="keys sampled per key class")
    parser.add_argument("--data-dir", type=Path, default=None, help="parent of server data dirs")
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    if args.quick:
        args.tasks = 100_000
    unknown = [n for n in args.layouts.split(",") if n not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layouts: {', '.join(unknown)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="tw-bench-memory-"))
    print(
        f"memory bench: {args.tasks:,} tasks per layout, {PAYLOAD_BYTES} B JSON payload, "
        f"{SHARDS} shards, {args.tenants} tenants, due over {args.spread_s:,.0f} s; "
        "each layout on a fresh redis-server with AOF "
        "appendfsync everysec (load speed only: memory does not depend on it) and "
        "auto-aof-rewrite off",
        flush=True,
    )
    results = []
    started = time.perf_counter()
    try:
        for name in args.layouts.split(","):
            t0 = time.perf_counter()
            results.append(run_layout(LAYOUTS[name], args, root))
            r = results[-1]
            print(
                f"  {name}: {r['bytes_per_task']:.1f} B/task "
                f"({r['bytes_per_task_excl_event_log']:.1f} excl. event log), "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    finally:
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print_table(results, args.tasks)
    print_breakdowns(results)
    print()
    print(summary_line(results, args.tasks))
    out = {
        "parameters": {
            "tasks": args.tasks,
            "payload_bytes": PAYLOAD_BYTES,
            "shards": SHARDS,
            "tenants": args.tenants,
            "spread_days": round(args.spread_s / 86_400, 4),
            "horizon_ms": Settings().horizon_ms,
            "event_log_max": Settings().event_log_max,
            "redis_version": results[0]["redis_version"] if results else None,
            "appendfsync": "everysec",
            "auto_aof_rewrite": "off",
            "loader": args.loader,
            "caps": args.caps,
            "sample_keys_per_class": args.sample,
            "seconds": round(time.perf_counter() - started, 1),
        },
        "layouts": {r["layout"]: r for r in results},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
