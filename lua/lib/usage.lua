-- What a tenant holds in one shard, counted by the same call that changes it, so the
-- API can check the tenant's limits against it (timewheel/limits.py, docs/design.md).
-- Calls lib/record.lua (before it in LIBS).
--
--   tag..'use:'..tenant  HASH
--     q:<queue>  what holds the queue: its counted runs not finished (scheduled, in
--                flight, or waiting for a retry) and its schedules; removed at 0, so
--                the fields q:* are the tenant's queues in use
--     schedules  schedules
--     bytes      payload bytes held: the payloads of those runs, of dead-lettered runs
--                and of schedules
--   The runs not finished are the q:* counts less schedules: a run counts in its queue
--   only, so beginning or ending one costs one HINCRBY there and one in bytes.
--
-- Counted runs are a tenant's own: one-shot tasks, and a schedule's runs asked for by
-- hand (trigger, backfill). The runs the planner materializes are a schedule's, bounded
-- by its interval and the plan horizon, and count through the schedule; their payloads
-- count only while dead-lettered (a dead letter stays until replayed or purged).
--
--   usage_key(tag, tenant) -> key   the tenant's usage hash in shard `tag`.
--   usage_add(ukey, field, n)   add n (negative: take away) to one count of ukey.
--   usage_run(ukey, r, runs, bytes)   run r begins (1) or ends (-1) counting in its
--       queue, and its payload in bytes (1, -1 or 0 for no change).
--   usage_counted(r) -> bool   whether run r is a counted run (see above).
--   usage_tally(tally, tenant, queue, bytes, runs)   note one counted run created (runs
--       1, the default) or finished (runs -1, bytes negative), in a table
--       {tenant -> {bytes, queues}} (a call creating or finishing many runs adds once per
--       tenant and queue).
--   usage_flush(tag, tally)   add up a tally in shard `tag`.
--   usage_held(ukey) -> n   the tenant's counted runs not finished in this shard (the
--       q:* counts less schedules), what a create's cap (task_create.lua,
--       schedule_add_runs.lua) is checked against: one HGETALL of a hash of a few fields.
--
-- A count never goes below 0 (so taking away n at once leaves what n single steps would): a deployment upgraded from a version without these counts
-- finishes runs it never counted, so the counts may be short until those runs are gone.

local function usage_key(tag, tenant)
  return tag .. 'use:' .. tenant
end

local function usage_add(ukey, field, n)
  if n == 0 then
    return
  end
  local v = redis.call('HINCRBY', ukey, field, string.format('%d', n))
  if v <= 0 then
    if string.sub(field, 1, 2) == 'q:' then
      redis.call('HDEL', ukey, field)
    elseif v < 0 then
      redis.call('HSET', ukey, field, 0)
    end
  end
end

local function usage_counted(r)
  return r[R_SCHEDULE] == nil or
    (r[R_OPTS] ~= nil and string.find(r[R_OPTS], '"origin":', 1, true) ~= nil)
end

local function usage_run(ukey, r, runs, bytes)
  if runs ~= 0 then
    usage_add(ukey, 'q:' .. r[R_QUEUE], runs)
  end
  if bytes ~= 0 then
    usage_add(ukey, 'bytes', bytes * #(r[R_PAYLOAD] or ''))
  end
end

local function usage_tally(tally, tenant, queue, bytes, runs)
  local t = tally[tenant]
  if t == nil then
    t = { bytes = 0, queues = {} }
    tally[tenant] = t
  end
  t.bytes = t.bytes + bytes
  t.queues[queue] = (t.queues[queue] or 0) + (runs or 1)
end

local function usage_flush(tag, tally)
  for tenant, t in pairs(tally) do
    local ukey = usage_key(tag, tenant)
    usage_add(ukey, 'bytes', t.bytes)
    for queue, n in pairs(t.queues) do
      usage_add(ukey, 'q:' .. queue, n)
    end
  end
end

local function usage_held(ukey)
  local raw = redis.call('HGETALL', ukey)
  local n = 0
  for i = 1, #raw, 2 do
    local field = raw[i]
    if string.sub(field, 1, 2) == 'q:' then
      n = n + tonumber(raw[i + 1])
    elseif field == 'schedules' then
      n = n - tonumber(raw[i + 1])
    end
  end
  return math.max(n, 0)
end
