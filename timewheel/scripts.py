"""Loads lua/, one wrapper per operation, and maps script return codes to errors.

Scripts run as EVALSHA with EVAL as the NOSCRIPT fallback (which also caches them on
that node). We chose this over a Redis Function library because the script travels
with the client: after a restart or failover the first call reloads it, old and new
daemons run side by side in a rolling upgrade (their SHAs differ), and on Cluster each
primary caches a script lazily when a key first routes there, with no deploy step.
Shared helpers live in lua/lib/ and are inlined at load time by `--!include` lines.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from importlib import resources
from pathlib import Path
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from timewheel.errors import InvalidState, LeaseLost, ScriptError, TaskNotFound
from timewheel.record import TaskState
from timewheel.redis_client import RedisClient

OPERATIONS = (
    "create",
    "tick",
    "promote",
    "cancel",
    "update",
    "ack",
    "expire_finished",
    "fail",
    "reap",
    "replay_dead",
    "purge_dead",
    "lease_acquire",
    "lease_renew",
    "lease_release",
    "heartbeat",
    "schedule_create",
    "schedule_update",
    "schedule_pause",
    "schedule_resume",
    "schedule_delete",
    "schedule_add_runs",
    "materialize",
    "schedule_restore",
    "restore",
)
_INCLUDE = re.compile(r"^--!include (\S+)\s*$", re.MULTILINE)
_CODE = re.compile(r"\{(-\d+)[^}]*\}\s+([A-Z_]+)")

ScriptArg = str | int | bytes


class ScriptCode(IntEnum):
    """Expected negative outcomes, as listed in the script headers."""

    NOT_FOUND = -1
    INVALID_STATE = -2
    LEASE_LOST = -3


def lua_dir() -> Path:
    """Where the Lua sources are: inside the installed wheel, or the repository's lua/."""
    packaged = resources.files("timewheel").joinpath("lua")
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / "lua"


def render(name: str, root: Path | None = None) -> str:
    """The source of one operation with its `--!include` lines replaced by the files."""
    base = root or lua_dir()
    source = (base / f"{name}.lua").read_text()
    return _INCLUDE.sub(lambda m: (base / m.group(1)).read_text(), source)


def header_codes(name: str, root: Path | None = None) -> dict[int, str]:
    """The negative codes a script's header documents, as {code: NAME}."""
    source = ((root or lua_dir()) / f"{name}.lua").read_text()
    header = source.split("]]", 1)[0]
    return {int(code): label for code, label in _CODE.findall(header)}


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua operation, run by SHA with a load-on-miss fallback."""

    name: str
    source: str
    sha: str

    @classmethod
    def load(cls, name: str) -> Script:
        source = render(name)
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())

    async def load_everywhere(self, client: RedisClient) -> None:
        """SCRIPT LOAD on the server, or on every primary of a Cluster (before a pipeline)."""
        if isinstance(client, RedisCluster):
            for node in client.get_primaries():
                await client.execute_command("SCRIPT", "LOAD", self.source, target_nodes=node)
        else:
            await client.script_load(self.source)

    async def __call__(
        self, client: RedisClient, keys: Sequence[str], args: Sequence[ScriptArg]
    ) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)


class Scripts:
    """All operations of lua/, loaded once per process."""

    def __init__(self) -> None:
        self.create = Script.load("create")
        self.tick = Script.load("tick")
        self.promote = Script.load("promote")
        self.cancel = Script.load("cancel")
        self.update = Script.load("update")
        self.ack = Script.load("ack")
        self.expire_finished = Script.load("expire_finished")
        self.fail = Script.load("fail")
        self.reap = Script.load("reap")
        self.replay_dead = Script.load("replay_dead")
        self.purge_dead = Script.load("purge_dead")
        self.lease_acquire = Script.load("lease_acquire")
        self.lease_renew = Script.load("lease_renew")
        self.lease_release = Script.load("lease_release")
        self.heartbeat = Script.load("heartbeat")
        self.schedule_create = Script.load("schedule_create")
        self.schedule_update = Script.load("schedule_update")
        self.schedule_pause = Script.load("schedule_pause")
        self.schedule_resume = Script.load("schedule_resume")
        self.schedule_delete = Script.load("schedule_delete")
        self.schedule_add_runs = Script.load("schedule_add_runs")
        self.materialize = Script.load("materialize")
        self.schedule_restore = Script.load("schedule_restore")
        self.restore = Script.load("restore")

    def all(self) -> list[Script]:
        return [getattr(self, name) for name in OPERATIONS]


def check(reply: list[Any], *, run_id: str = "", action: str = "", shard: int = -1) -> list[Any]:
    """Turn a script's negative code into its exception; pass anything else through."""
    code = int(reply[0])
    if code >= 0:
        return reply
    if code == ScriptCode.NOT_FOUND:
        raise TaskNotFound(run_id)
    if code == ScriptCode.INVALID_STATE:
        # A run's state comes as its integer, a schedule's as its name.
        state = reply[1]
        label = state.decode() if isinstance(state, bytes) else TaskState(int(state)).label
        raise InvalidState(run_id, label, action)
    if code == ScriptCode.LEASE_LOST:
        raise LeaseLost(shard)
    raise ScriptError(f"unexpected code {code} from a script ({action or 'call'})")
