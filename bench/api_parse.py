"""The create path's request layer alone: the body's bytes to NewTask(s), as POST /v1/tasks
and POST /v1/tasks/batch do before the first Redis call (decode, check every field and
rule, build the task). No server, no Redis: one Python process per measurement.

Bodies:
  minimal   {"delay": 60, "payload": "<98 x>"}: the body bench/api.py sends
  typical   run_at, queue, idempotency_key, retry and a small object payload
  batch     {"tasks": [1,000 minimal items]}: the batch bench/api.py sends

Each figure is the median over `--repeats` timed loops of the time per body. With
`--base DIR` (a checkout of another commit, e.g. `git worktree add ../base main`), the same
measurement runs on that tree's code too, alternating with this tree's round by round
(A, B, A, B ...) so both see the same host; each run is a fresh process with PYTHONPATH
set to its tree.

Run:  .venv/bin/python bench/api_parse.py
      .venv/bin/python bench/api_parse.py --base /path/to/checkout --rounds 4
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "api_parse.json"
PAYLOAD = "x" * 98  # a JSON string of 100 bytes

MINIMAL = json.dumps({"delay": 60, "payload": PAYLOAD}).encode()
TYPICAL = json.dumps(
    {
        "run_at": "2026-12-24T09:00:00+01:00",
        "queue": "emails",
        "idempotency_key": "welcome-2026-12-24-a@b.c",
        "retry": {"max_attempts": 5, "initial_s": 2.5},
        "payload": {"to": "a@b.c", "template": "welcome", "vars": {"name": "Ada", "n": 3}},
    }
).encode()
BATCH = json.dumps({"tasks": [{"delay": 60, "payload": PAYLOAD}] * 1000}).encode()


def _parsers() -> tuple[str, Callable[[bytes], object], Callable[[bytes], list[object]]]:
    """(name, one create body -> NewTask, batch body -> NewTask or error per item) with
    the code of the timewheel on sys.path: msgspec declarations or the field specs."""
    try:
        decode = importlib.import_module("timewheel.api.decode")
    except ImportError:
        return _field_specs()
    schemas = importlib.import_module("timewheel.api.task_schemas")
    errors = importlib.import_module("timewheel.errors")
    create, batch = decode.BodyDecoder(schemas.TaskCreate), decode.BodyDecoder(schemas.TaskBatch)

    def one(body: bytes) -> object:
        return schemas.new_task(
            create.decode(body), "bench", default_queue="default", idempotency_header=None
        )

    def many(body: bytes) -> list[object]:
        out: list[object] = []
        for i, item in enumerate(batch.decode(body).tasks):
            try:
                parsed = create.decode(item, root=f"tasks[{i}]")
                out.append(
                    schemas.new_task(
                        parsed, "bench", default_queue="default", idempotency_header=None
                    )
                )
            except errors.ValidationError as exc:
                out.append(exc)
        return out

    return "msgspec declarations", one, many


def _field_specs() -> tuple[str, Callable[[bytes], object], Callable[[bytes], list[object]]]:
    common = importlib.import_module("timewheel.api.common")
    schemas = importlib.import_module("timewheel.api.task_schemas")
    errors = importlib.import_module("timewheel.errors")

    def one(body: bytes) -> object:
        parsed = schemas.CREATE.parse(common.parse_json_object(body))
        return schemas.new_task(parsed, "bench", default_queue="default", idempotency_header=None)

    def many(body: bytes) -> list[object]:
        out: list[object] = []
        for item in schemas.BATCH.parse(common.parse_json_object(body))["tasks"]:
            try:
                out.append(
                    schemas.parse_create(
                        item, "bench", default_queue="default", idempotency_header=None
                    )
                )
            except errors.ValidationError as exc:
                out.append(exc)
        return out

    return "field specs", one, many


def _per_call_us(call: Callable[[], object], loops: int, repeats: int) -> float:
    """Median over `repeats` of the time per call, in microseconds."""
    call()  # warm caches
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(loops):
            call()
        times.append((time.perf_counter() - started) / loops)
    return round(statistics.median(times) * 1e6, 2)


def measure(repeats: int) -> dict[str, Any]:
    """The figures of the timewheel importable here."""
    name, one, many = _parsers()
    assert len(many(BATCH)) == 1000
    assert not any(isinstance(r, Exception) for r in many(BATCH))
    return {
        "code": name,
        "minimal_us": _per_call_us(lambda: one(MINIMAL), 20_000, repeats),
        "typical_us": _per_call_us(lambda: one(TYPICAL), 10_000, repeats),
        "batch_1000_ms": round(_per_call_us(lambda: many(BATCH), 20, repeats) / 1000, 3),
    }


def _run(tree: Path, repeats: int) -> dict[str, Any]:
    """measure() in a fresh process whose timewheel is the one of `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, __file__, "measure", "--repeats", str(repeats)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd="/",
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _commit(tree: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("minimal_us", "typical_us", "batch_1000_ms")
    return {
        "code": runs[0]["code"],
        **{k: round(statistics.median(r[k] for r in runs), 3) for k in keys},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["measure"]:
        p = argparse.ArgumentParser(prog="api_parse.py measure")
        p.add_argument("--repeats", type=int, default=7)
        print(json.dumps(measure(p.parse_args(argv[1:]).repeats)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="another checkout to measure alternately")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each tree")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    trees = {"this": ROOT, **({"base": args.base.resolve()} if args.base else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            runs[name].append(_run(tree, args.repeats))
            print(f"{name:5} {json.dumps(runs[name][-1])}", flush=True)
    out: dict[str, Any] = {
        "bench": "api_parse",
        "machine": "2 shared cores; one Python process per run, no server",
        "method": f"median of {args.repeats} timed loops per run, median of {args.rounds} runs",
        "bodies": {
            "minimal_bytes": len(MINIMAL),
            "typical_bytes": len(TYPICAL),
            "batch_bytes": len(BATCH),
        },
    }
    for name, tree in trees.items():
        out[name] = {"commit": _commit(tree), **_median(runs[name]), "runs": runs[name]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for name in trees:
        m = out[name]
        print(
            f"{name} ({m['code']}, {m['commit']}): minimal {m['minimal_us']} us, "
            f"typical {m['typical_us']} us, batch of 1,000 {m['batch_1000_ms']} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
