"""HTTP API throughput and latency: one `timewheel api` process (uvicorn, uvloop, httptools)
on a fresh redis-server with AOF appendfsync always, load from another process on loopback.

a. single: POST /v1/tasks, one task per request (100-byte payload, delay 60 s), closed
   loop over `--connections` (32) keep-alive connections for `--seconds`, `--depth`
   requests pipelined on each (1: one at a time). Target >= 5,000/s.
b. batch: POST /v1/tasks/batch with `--batch` (1,000) tasks per request, same loop over
   `--batch-connections` (4). Target
   >= 30,000 tasks/s.

With `--unix` the api processes reach Redis over its Unix socket, not loopback TCP.

With `--api-processes N`, N api processes (each on its own port) share the connections;
the api CPU is theirs added up. The load generator reports its own CPU too.

Latency is per request, send to last byte of the answer (p50, p99). The load generator
writes prebuilt HTTP/1.1 requests on raw asyncio streams (an httpx client costs more CPU
per request than the server does). The tenant has the default limits: each create is
checked against its counts, which the api reads at most once a second. Figures depend
on the 2 shared cores: Redis, the api process and the generator run on them at once.

Run:  .venv/bin/python bench/api.py               (20 s per part)
      .venv/bin/python bench/api.py --seconds 5   (smoke run)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import percentile

from timewheel.sdk.client import Client
from timewheel.store.server import RedisServer, find_free_port

RESULTS = Path(__file__).resolve().parent / "results" / "api.json"
SINGLE_TARGET = 10_000
BATCH_TARGET = 30_000
PAYLOAD = "x" * 98  # a JSON string of 100 bytes


def request_bytes(host: str, key: str, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    await reader.readexactly(length)
    return status


async def _connection(
    port: int,
    request: bytes,
    stop_at: float,
    latencies: list[float],
    statuses: dict[int, int],
    depth: int = 1,
) -> None:
    """Closed loop on one keep-alive connection: `depth` requests written at once
    (HTTP/1.1 pipelining, depth 1: one at a time), then their answers read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    requests = request * depth
    try:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            writer.write(requests)
            for _ in range(depth):
                status = await _read_response(reader)
                latencies.append(time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def load(
    ports: list[int],
    key: str,
    mode: str,
    seconds: float,
    connections: int,
    batch: int,
    depth: int = 1,
) -> Any:
    """The closed loop over `connections`, spread round-robin over the api `ports`."""
    port = ports[0]
    if mode == "single":
        body = json.dumps({"delay": 60, "payload": PAYLOAD}).encode()
        request = request_bytes(f"127.0.0.1:{port}", key, "/v1/tasks", body)
    else:
        tasks = [{"delay": 60, "payload": PAYLOAD}] * batch
        body = json.dumps({"tasks": tasks}).encode()
        request = request_bytes(f"127.0.0.1:{port}", key, "/v1/tasks/batch", body)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    started, cpu = time.monotonic(), time.process_time()
    stop_at = started + seconds
    await asyncio.gather(
        *(
            _connection(ports[i % len(ports)], request, stop_at, latencies, statuses, depth)
            for i in range(connections)
        )
    )
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    latencies.sort()
    per_request = 1 if mode == "single" else batch
    ok = statuses.get(201 if mode == "single" else 200, 0)
    return {
        "mode": mode,
        "seconds": round(elapsed, 2),
        "connections": connections,
        "pipeline_depth": depth,
        "tasks_per_request": per_request,
        "loadgen_cpu_share": round(cpu / elapsed, 2),
        "loadgen_cpu_us_per_request": round(cpu * 1e6 / max(1, len(latencies)), 1),
        "requests": len(latencies),
        "statuses": {str(k): v for k, v in statuses.items()},
        "requests_per_s": round(len(latencies) / elapsed),
        "tasks_per_s": round(ok * per_request / elapsed),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
        "p99_ms": round(percentile(latencies, 99) * 1000, 2),
    }


def _run_fast(main: Any) -> Any:
    """The load generator on uvloop (less of the shared cores for the client)."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def run_load(ports: list[int], key: str, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """The load in a process of its own; its summary comes back on stdout."""
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "load",
            "--ports",
            ",".join(map(str, ports)),
            "--key",
            key,
            "--mode",
            mode,
            "--seconds",
            str(args.seconds),
            "--connections",
            str(args.connections if mode == "single" else args.batch_connections),
            "--batch",
            str(args.batch),
            "--depth",
            str(args.depth if mode == "single" else 1),
        ],
        capture_output=True,
        text=True,
        timeout=args.seconds + 120,
        check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + sys) a process has used, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def redis_cpu_s(url: str) -> float:
    """CPU seconds used so far by redis-server's main thread (user + sys)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        info: dict[str, Any] = client.info("cpu")
    finally:
        client.close()
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def start_api(redis_url: str, admin_key: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = find_free_port()
    env = {**os.environ, "TIMEWHEEL_ADMIN_KEY": admin_key}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "timewheel.cli",
                "api",
                "--redis-url",
                redis_url,
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz")
            return proc, port
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"api did not start: {log.read_text()}") from None
            time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["load"]:
        p = argparse.ArgumentParser(prog="api.py load")
        p.add_argument("--ports", required=True, help="api ports, comma-separated")
        p.add_argument("--key", required=True)
        p.add_argument("--mode", choices=("single", "batch"), required=True)
        p.add_argument("--seconds", type=float, default=20)
        p.add_argument("--connections", type=int, default=32)
        p.add_argument("--batch", type=int, default=1000)
        p.add_argument("--depth", type=int, default=1)
        a = p.parse_args(argv[1:])
        ports = [int(p) for p in a.ports.split(",")]
        result = load(ports, a.key, a.mode, a.seconds, a.connections, a.batch, a.depth)
        print(json.dumps(_run_fast(result)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each part")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections")
    parser.add_argument("--batch", type=int, default=1000, help="tasks per batch request")
    parser.add_argument(
        "--depth",
        type=int,
        default=1,
        help="single part: requests pipelined per connection at once (1: one at a time)",
    )
    parser.add_argument(
        "--batch-connections", type=int, default=4, help="connections of the batch part"
    )
    parser.add_argument(
        "--api-processes",
        type=int,
        default=1,
        help="api processes, each on its own port; the connections are spread over them",
    )
    parser.add_argument("--parts", default="single,batch")
    parser.add_argument(
        "--unix",
        action="store_true",
        help="the api processes reach Redis over its Unix socket (as timewheel dev's do)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--py-spy", type=Path, help="record the api process with py-spy into this directory"
    )
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tw-bench-api-") as tmp:
        server = RedisServer(Path(tmp) / "redis", appendfsync="always", unix_socket=args.unix)
        with server:
            admin_key = "tw_bench_admin"
            redis_url = server.local_url if args.unix else server.url
            apis = [
                start_api(redis_url, admin_key, Path(tmp) / f"api-{i}.log")
                for i in range(args.api_processes)
            ]
            proc, port = apis[0]
            ports = [p for _, p in apis]
            try:
                with Client(f"http://127.0.0.1:{port}", admin_key) as admin:
                    admin.create_tenant("bench")
                    key = admin.create_key("bench")["key"]
                for part in args.parts.split(","):
                    spy = None
                    if args.py_spy:
                        spy = subprocess.Popen(
                            [
                                "py-spy",
                                "record",
                                "-p",
                                str(proc.pid),
                                "-r",
                                "200",
                                "-f",
                                "raw",
                                "-o",
                                str(args.py_spy / f"{part}.txt"),
                                "-d",
                                str(int(args.seconds)),
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                    cpu_before = redis_cpu_s(server.url)
                    api_before = sum(process_cpu_s(a.pid) for a, _ in apis)
                    results[part] = run_load(ports, key, part, args)
                    r = results[part]
                    tasks_done = max(1, r["tasks_per_s"] * r["seconds"])
                    api_cpu = sum(process_cpu_s(a.pid) for a, _ in apis) - api_before
                    r["api_processes"] = len(apis)
                    r["api_cpu_share"] = round(api_cpu / r["seconds"], 2)
                    r["api_cpu_us_per_task"] = round(api_cpu * 1e6 / tasks_done, 1)
                    r["redis_cpu_s"] = round(redis_cpu_s(server.url) - cpu_before, 2)
                    r["redis_cpu_share"] = round(r["redis_cpu_s"] / r["seconds"], 2)
                    r["redis_cpu_us_per_task"] = round(
                        r["redis_cpu_s"] * 1e6 / max(1, r["tasks_per_s"] * r["seconds"]), 1
                    )
                    if spy is not None:
                        spy.wait(timeout=60)
                    r = results[part]
                    target = SINGLE_TARGET if part == "single" else BATCH_TARGET
                    print(
                        f"{part}: {r['tasks_per_s']:,} tasks/s ({r['requests_per_s']:,} req/s, "
                        f"{r['connections']} connections, {r['tasks_per_request']} task(s)/req) "
                        f"p50 {r['p50_ms']} ms p99 {r['p99_ms']} ms; target {target:,}/s "
                        f"{'met' if r['tasks_per_s'] >= target else 'NOT met'}; "
                        f"{len(apis)} api process(es) {r['api_cpu_share']:.0%} of a core, "
                        f"{r['api_cpu_us_per_task']} us/task; "
                        "redis main "
                        f"thread {r['redis_cpu_share']:.0%} busy, "
                        f"{r['redis_cpu_us_per_task']} us/task; load generator "
                        f"{r['loadgen_cpu_share']:.0%} of a core, "
                        f"{r['loadgen_cpu_us_per_request']} us/request (depth "
                        f"{r['pipeline_depth']}); statuses {r['statuses']}",
                        flush=True,
                    )
            finally:
                for api_proc, _ in apis:
                    api_proc.terminate()
                for api_proc, _ in apis:
                    api_proc.wait(timeout=20)
    out = {
        "bench": "api",
        "machine": "2 cores shared by redis-server, the api process and the load generator "
        "(and other engineers' work)",
        "redis": "AOF appendfsync always",
        "targets": {"single_per_s": SINGLE_TARGET, "batch_tasks_per_s": BATCH_TARGET},
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
