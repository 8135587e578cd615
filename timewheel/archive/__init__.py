"""PostgreSQL: the event archiver, run history, snapshots and restore."""
