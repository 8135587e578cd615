-- timewheel archive schema, version 1. Applied once, in a transaction, by timewheel/archive/pg.py.
-- One timewheel deployment per database. Times are epoch milliseconds (bigint), as in Redis.
-- A stream entry id "<ms>-<seq>" is kept as two bigints so it sorts and compares in SQL.

-- Per shard: the last event-log entry stored here. Written in the same transaction as the
-- rows of that entry, so a crash can neither lose nor double an event.
CREATE TABLE archive_checkpoints (
    shard       integer PRIMARY KEY,
    last_ms     bigint  NOT NULL,
    last_seq    bigint  NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per (event-log entry, run). A 'dispatched' entry lists many runs and becomes one
-- row per run; every other entry names one run. payload/opts are filled for created and
-- updated events only (read from the run's record when archived: the events carry none).
CREATE TABLE run_events (
    shard       integer NOT NULL,
    id_ms       bigint  NOT NULL,
    id_seq      bigint  NOT NULL,
    run_id      text    NOT NULL,
    kind        text    NOT NULL,
    at_ms       bigint  NOT NULL,
    tenant      text,               -- null on dispatched rows (the entry names no tenant)
    queue       text,
    attempt     integer,
    due_ms      bigint,
    reason      text,
    error       text,
    node        text,
    epoch       text,
    payload     text,
    opts        text,
    archived_at timestamptz NOT NULL DEFAULT clock_timestamp(),  -- when this row was written
    PRIMARY KEY (shard, id_ms, id_seq, run_id)
);
CREATE INDEX run_events_run ON run_events (run_id, id_ms, id_seq);

-- Latest archived state of every task the archiver has seen (an operator's view; restore
-- uses snapshots plus run_events). Columns left null are not known from the events yet.
CREATE TABLE tasks (
    run_id      text PRIMARY KEY,
    shard       integer NOT NULL,
    tenant      text,
    queue       text,
    state       text NOT NULL,
    attempt     integer,
    due_ms      bigint,
    created_ms  bigint,
    updated_ms  bigint,
    payload     text,
    opts        text,
    last_error  text,
    schedule_id text
);
CREATE INDEX tasks_tenant_state ON tasks (tenant, state);

-- Recurring schedules, latest state from the newest snapshot (there are no schedule
-- events yet). `definition` is the schedule hash as stored in Redis, field -> value.
CREATE TABLE schedules (
    schedule_id text PRIMARY KEY,
    shard       integer NOT NULL,
    tenant      text,
    definition  jsonb NOT NULL,
    snapshot_id bigint NOT NULL
);

-- A snapshot is complete once finished_at is set (it is written in the same transaction
-- as its rows, so a snapshot that died half way is never seen).
CREATE TABLE snapshots (
    snapshot_id bigserial PRIMARY KEY,
    prefix      text    NOT NULL,
    shards      integer NOT NULL,
    bucket_ms   bigint  NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    tasks       bigint,
    schedules   bigint
);

-- Per shard: the event-log position read before the shard's records were copied.
-- Restore replays this shard's archived events after it on top of the copied records.
CREATE TABLE snapshot_shards (
    snapshot_id bigint  NOT NULL REFERENCES snapshots ON DELETE CASCADE,
    shard       integer NOT NULL,
    from_ms     bigint  NOT NULL,
    from_seq    bigint  NOT NULL,
    PRIMARY KEY (snapshot_id, shard)
);

-- Pending runs (scheduled, or dispatched and not yet acknowledged) as copied.
CREATE TABLE snapshot_tasks (
    snapshot_id bigint  NOT NULL REFERENCES snapshots ON DELETE CASCADE,
    shard       integer NOT NULL,
    run_id      text    NOT NULL,
    tenant      text    NOT NULL,
    queue       text    NOT NULL,
    state       text    NOT NULL,
    attempt     integer NOT NULL,
    due_ms      bigint  NOT NULL,
    created_ms  bigint  NOT NULL,
    updated_ms  bigint,
    payload     text    NOT NULL,
    opts        text,
    last_error  text,
    schedule_id text,
    PRIMARY KEY (snapshot_id, run_id)
);

CREATE TABLE snapshot_schedules (
    snapshot_id bigint  NOT NULL REFERENCES snapshots ON DELETE CASCADE,
    shard       integer NOT NULL,
    schedule_id text    NOT NULL,
    tenant      text,
    definition  jsonb   NOT NULL,
    PRIMARY KEY (snapshot_id, schedule_id)
);
