"""Loads lua/ as one Redis Function library, one function per operation, and maps
script return codes to errors.

Why a library and not EVALSHA: a script run by EVALSHA executes its whole chunk on
every call, so the helpers it inlines from lua/lib/ were rebuilt as closures each time:
about 6-8 us of every call here, a fifth of a create or an idle tick. In a library the
helpers are built once, when it loads. The library is persisted in the AOF and
replicated, so it survives a restart and a failover. Its name and its functions' names
carry a hash of the sources (`timewheel_<v>`, `tw_<v>_dispatch_tick`), so an old and a new daemon
run side by side in a rolling upgrade, each calling its own version. FUNCTION LOAD does
not spread between Cluster shards: a call that finds no function loads the library on
every primary and is sent again, so a new node or an emptied server needs no deploy step.
Each lua/<operation>.lua stays a file of its own with its contract in its header; its
`--!include` lines name the helpers it uses, which the library defines above it.
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
from redis.exceptions import ResponseError

from timewheel.errors import ConfigError, InvalidState, LeaseLost, ScriptError, TaskNotFound
from timewheel.store.connection import RedisClient
from timewheel.types import TaskState

OPERATIONS = (
    "task_create",
    "dispatch_tick",
    "dispatch_promote",
    "task_cancel",
    "task_update",
    "run_ack",
    "dispatch_expire",
    "run_fail",
    "dispatch_reap",
    "dead_replay",
    "dead_purge",
    "lease_acquire",
    "lease_renew",
    "lease_release",
    "lease_members",
    "schedule_create",
    "schedule_update",
    "schedule_pause",
    "schedule_resume",
    "schedule_delete",
    "schedule_add_runs",
    "schedule_due",
    "schedule_materialize",
    "restore_schedule",
    "restore_runs",
    "restore_finished",
    "snapshot_sent",
    "archive_records",
    "audit_shard",
    "audit_records",
    "audit_stream",
    "audit_confirm",
    "audit_near",
    "audit_far",
    "audit_schedules",
    "repair_wheel",
    "repair_retry",
    "repair_pending",
    "repair_plan",
    "repair_usage",
    "audit_publish",
    "audit_archive",
)
READ_ONLY = (
    "audit_shard",
    "audit_near",
    "audit_far",
    "audit_schedules",
    "audit_archive",
    "snapshot_sent",
    "archive_records",
)
"""Operations registered with the no-writes flag: Redis refuses any write they attempt."""
LIBS = (
    "hash",
    "clock",
    "bodies",
    "wheel",
    "record",
    "usage",
    "wake",
    "events",
    "lease",
    "dead",
    "schedule",
    "retry",
    "lag",
    "rate",
    "park",
    "delivery",
    "audit",
)
"""lua/lib/ helpers in library order: each after the helpers it calls."""
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
    return Path(__file__).resolve().parents[2] / "lua"


def header_codes(name: str, root: Path | None = None) -> dict[int, str]:
    """The negative codes a script's header documents, as {code: NAME}."""
    source = ((root or lua_dir()) / f"{name}.lua").read_text()
    header = source.split("]]", 1)[0]
    return {int(code): label for code, label in _CODE.findall(header)}


def is_missing_function(reply: object) -> bool:
    """Whether a reply (or raised error) says the server lacks this library version."""
    return isinstance(reply, ResponseError) and "Function not found" in str(reply)


@dataclass(frozen=True, slots=True)
class Library:
    """Every operation of lua/ as one versioned Function library."""

    name: str
    version: str
    source: str

    @classmethod
    def build(cls, root: Path | None = None) -> Library:
        base = root or lua_dir()
        helpers = [(base / "lib" / f"{lib}.lua").read_text() for lib in LIBS]
        bodies = {op: _body(base, op) for op in OPERATIONS}
        version = hashlib.sha1("\0".join([*helpers, *bodies.values()]).encode()).hexdigest()[:12]
        parts = [f"#!lua name=timewheel_{version}", *helpers]
        for op, body in bodies.items():
            # The operation's chunk becomes a function of (KEYS, ARGV): its top-level
            # locals are per call, the helpers above are the library's, built once. What
            # lib/bodies.lua keeps of the shard it read is forgotten at every call's start,
            # and the records the call added or deleted are counted at its end.
            name = function_name(version, op)
            call = (
                f"function(KEYS, ARGV)\nbody_forget()\nlocal reply = op_{op}(KEYS, ARGV)\n"
                "body_flush()\nreturn reply\nend"
            )
            register = (
                f"redis.register_function{{function_name='{name}', callback={call}, "
                "flags={'no-writes'}}"
                if op in READ_ONLY
                else f"redis.register_function('{name}', {call})"
            )
            parts.append(f"local function op_{op}(KEYS, ARGV)\n{body}\nend\n{register}")
        return cls(f"timewheel_{version}", version, "\n".join(parts) + "\n")

    async def load(self, client: RedisClient) -> None:
        """FUNCTION LOAD on the server, or on every primary of a Cluster. A library of the
        same version already there (another process loaded it) is success."""
        nodes = client.get_primaries() if isinstance(client, RedisCluster) else [None]
        for node in nodes:
            try:
                if node is None:
                    await client.execute_command("FUNCTION", "LOAD", self.source)
                else:
                    await client.execute_command("FUNCTION", "LOAD", self.source, target_nodes=node)
            except ResponseError as exc:
                if "already exists" not in str(exc):
                    raise


def _body(base: Path, op: str) -> str:
    """An operation's source without its `--!include` lines, which must name helpers of
    LIBS: the library defines them all above every operation."""
    source = (base / f"{op}.lua").read_text()
    unknown = [m for m in _INCLUDE.findall(source) if Path(m).stem not in LIBS]
    if unknown:
        raise ConfigError(f"lua/{op}.lua includes {unknown}: not among the helpers {LIBS}")
    return _INCLUDE.sub("", source)


def function_name(version: str, operation: str) -> str:
    return f"tw_{version}_{operation}"


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua operation: a function of the library, called by FCALL; a server without
    the library gets it loaded, then the call is sent again (it did not run)."""

    name: str
    function: str
    library: Library

    async def __call__(
        self, client: RedisClient, keys: Sequence[str], args: Sequence[ScriptArg]
    ) -> Any:
        try:
            return await client.execute_command("FCALL", self.function, len(keys), *keys, *args)
        except ResponseError as exc:
            if not is_missing_function(exc):
                raise
        await self.library.load(client)
        return await client.execute_command("FCALL", self.function, len(keys), *keys, *args)


class Scripts:
    """All operations of lua/, loaded once per process."""

    def __init__(self, library: Library | None = None) -> None:
        self.library = library or Library.build()
        for op in OPERATIONS:
            setattr(self, op, Script(op, function_name(self.library.version, op), self.library))

    task_create: Script
    dispatch_tick: Script
    dispatch_promote: Script
    task_cancel: Script
    task_update: Script
    run_ack: Script
    dispatch_expire: Script
    run_fail: Script
    dispatch_reap: Script
    dead_replay: Script
    dead_purge: Script
    lease_acquire: Script
    lease_renew: Script
    lease_release: Script
    lease_members: Script
    schedule_create: Script
    schedule_update: Script
    schedule_pause: Script
    schedule_resume: Script
    schedule_delete: Script
    schedule_add_runs: Script
    schedule_due: Script
    schedule_materialize: Script
    restore_schedule: Script
    restore_runs: Script
    restore_finished: Script
    snapshot_sent: Script
    archive_records: Script
    audit_shard: Script
    audit_records: Script
    audit_stream: Script
    audit_confirm: Script
    audit_near: Script
    audit_far: Script
    audit_schedules: Script
    repair_wheel: Script
    repair_retry: Script
    repair_pending: Script
    repair_plan: Script
    repair_usage: Script
    audit_publish: Script
    audit_archive: Script

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
