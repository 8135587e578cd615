"""The files `timewheel dev` keeps in its data folder: the credentials (mode 0600, kept
across saves) and the Redis folder moved aside by --restore."""

from __future__ import annotations

import stat
from pathlib import Path

from timewheel.cli.dev import Credentials, move_redis_aside


def test_credentials_round_trip_and_are_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "credentials.json"
    path.write_text("{}")
    path.chmod(0o644)  # a wider file from before is narrowed, not kept
    Credentials("tw_admin", "tw_tenant").save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Credentials.load(path) == Credentials("tw_admin", "tw_tenant")
    assert not path.with_suffix(".tmp").exists()


def test_missing_or_garbled_credentials_are_empty(tmp_path: Path) -> None:
    assert Credentials.load(tmp_path / "none.json") == Credentials()
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{not json")
    assert Credentials.load(garbled) == Credentials()


def test_move_redis_aside_moves_data_and_leaves_nothing_else(tmp_path: Path) -> None:
    redis_dir = tmp_path / "redis"
    assert move_redis_aside(redis_dir) is None  # no folder
    redis_dir.mkdir()
    assert move_redis_aside(redis_dir) is None  # an empty one stays
    (redis_dir / "redis.conf").write_text("port 1\n")
    moved = move_redis_aside(redis_dir)
    assert moved is not None and moved.name.startswith("redis.before-restore-")
    assert (moved / "redis.conf").read_text() == "port 1\n"
    assert not redis_dir.exists()
    redis_dir.mkdir()
    (redis_dir / "redis.conf").write_text("port 2\n")
    again = move_redis_aside(redis_dir)  # within the same second, most likely
    assert again is not None and again != moved
    assert (moved / "redis.conf").read_text() == "port 1\n"
