-- The archiver keeps `schedules` current from schedule events (created, updated, paused,
-- resumed, triggered, backfilled: the hash as read then; deleted: the row goes), so a
-- row no longer always comes from a snapshot.
ALTER TABLE schedules ALTER COLUMN snapshot_id DROP NOT NULL;
