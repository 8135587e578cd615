-- Recurring schedules (docs/design.md). Calls lib/hash.lua, lib/record.lua,
-- lib/wheel.lua and lib/events.lua (before it in LIBS). s below is a schedule's hash as
-- a table, ctx the planning context of schedule_ctx.
--
--   schedule_key(tag, sid) -> skey;  schedule_load(skey) -> s | nil;
--   schedule_owned(skey, tenant) -> s | nil (nil also for another tenant's);
--   schedule_fires(text) -> fires   'ms,ms,...' as a list of numbers;
--   schedule_opts(s) -> table   the options the schedule gives its runs.
--   schedule_ctx(tag, now, bucket_ms, misfire_ms, events_key, event_cap) -> ctx
--   schedule_extend(ctx, sid, skey, s, fires, after) -> added, skipped   plan fire times
--       and move the cursor, ending the schedule when nothing is left;
--       schedule_plan(ctx, sid, s, fires, after) -> added, skipped   only materialize.
--   schedule_runs_late(o, fire, now, misfire_ms)   whether a late run still runs.
--   schedule_skip(ctx, run_id, tenant, fire, reason, bkey, r)   record a skipped fire time.
--   schedule_drop_pending(tag, sid, bucket_ms) -> earliest, dropped   remove the runs
--       not yet sent.
--   schedule_run_live(tag, run_id)   whether a run is in flight.
--   schedule_run_finished(tag, sid, run_id, now, bucket_ms) -> wake   a run's end
--       releases the run overlap held back.
--   schedule_admit(ctx, bkey, run_id, r)   the tick's misfire and overlap checks.
--   schedule_index(tag, tenant, sid, next_ms)   put an active schedule in the plan index;
--       schedule_unindex(tag, tenant, sid)   take it out;
--       schedule_index_head(tag, tenant)   refresh the tenant's place in plan_tenants.
--
--   tag..'s:'..sid   HASH  the schedule: tenant queue payload opts spec catchup window_ms
--                          overlap max_runs state (active|paused|ended) cursor (last fire
--                          time planned, ms) next_ms (next fire time to plan, -1 = none)
--                          planned (fire times materialized so far) inflight held last_ms
--                          created_ms updated_ms paused_ms version
--   tag..'sr:'..sid  ZSET  run_id -> fire ms: its materialized runs; a dispatched one
--                          stays until the planner trims fire times past misfire_ms + 1 h
--                          (cheaper than a ZREM per dispatch; readers check the state)
--   tag..'plan_tenants'   ZSET  tenant -> the earliest next_ms of its plan index: the
--                          tenants with active schedules, for the planner to visit in turn
--   tag..'plan:'..tenant  ZSET  sid -> next_ms: the tenant's active schedules the planner
--                          must extend (schedule_index / schedule_unindex keep both)
--   tag..'plan'      ZSET  sid -> next_ms: the plan index of earlier library versions,
--                          moved into the two above by lua/schedule_due.lua
--   tag..'schedules' SET   every schedule id of the shard
--
-- A materialized run is an ordinary run (record, wheel entry) with id '<sid>@<fire ms>',
-- the schedule id in R_SCHEDULE, and the schedule's policies copied into its opts:
-- catchup, window_ms, overlap, and next_ms (when the schedule's next run is due, which
-- decides 'latest'). Manual and backfilled runs carry origin instead and are exempt
-- from catchup and overlap.
-- Jitter: a schedule's opts may hold jitter_offset_ms (timewheel/schedules/model.py picks it
-- per schedule within its jitter_s). Each run is then due that long after its fire time:
-- its record, wheel place, sr score and the next_ms of the run before it say fire +
-- offset, so lateness is measured from there. Its id and the schedule's cursor and
-- next_ms keep the fire time; the runs themselves carry no jitter fields.

local function schedule_key(tag, sid)
  return tag .. 's:' .. sid
end

-- The context the planning helpers below take (ctx): the shard tag, now, bucket_ms,
-- misfire_ms, the event log (events_key, event_cap), and wake, set to 1 once a run they
-- materialize becomes the shard's next action. The tick adds sent (schedule_admit).
local function schedule_ctx(tag, now, bucket_ms, misfire_ms, events_key, event_cap)
  return { tag = tag, now = now, bucket_ms = bucket_ms, misfire_ms = misfire_ms,
    events_key = events_key, event_cap = event_cap, wake = 0 }
end

-- The plan index: per tenant, its active schedules by next fire time to plan; per shard,
-- each such tenant by its earliest one, so the planner can give every tenant a share of
-- a pass (lua/schedule_due.lua) however many schedules another tenant has.
local function schedule_index_head(tag, tenant)
  local first = redis.call('ZRANGE', tag .. 'plan:' .. tenant, 0, 0, 'WITHSCORES')
  if first[1] then
    redis.call('ZADD', tag .. 'plan_tenants', first[2], tenant)
  else
    redis.call('ZREM', tag .. 'plan_tenants', tenant)
  end
end

local function schedule_index(tag, tenant, sid, next_ms)
  redis.call('ZADD', tag .. 'plan:' .. tenant, next_ms, sid)
  schedule_index_head(tag, tenant)
end

local function schedule_unindex(tag, tenant, sid)
  redis.call('ZREM', tag .. 'plan:' .. tenant, sid)
  redis.call('ZREM', tag .. 'plan', sid)  -- an entry of an earlier library version
  schedule_index_head(tag, tenant)
end

-- Whether a run due at `fire` (its fire time plus any jitter offset) still runs at
-- `now`, or is skipped as a misfire.
-- o: catchup, window_ms, next_ms (-1 = no later run known).
local function schedule_runs_late(o, fire, now, misfire_ms)
  if now - fire <= misfire_ms then
    return true
  end
  if o.catchup == 'all' then
    return now - fire <= (tonumber(o.window_ms) or 0)
  end
  if o.catchup == 'latest' then
    -- The newest missed fire time runs: the one whose successor is not missed too.
    local nxt = tonumber(o.next_ms) or -1
    return nxt < 0 or now - nxt <= misfire_ms
  end
  return false  -- skip
end

-- Record a fire time that will not run: as a skipped record when it was materialized
-- (bkey and r given), else as an event only.
local function schedule_skip(ctx, run_id, tenant, fire, reason, bkey, r)
  if r then
    r[R_STATE], r[R_UPDATED] = ST_SKIPPED, ctx.now
    record_save(bkey, run_id, r)
    wheel_retain(ctx.tag, run_id, ctx.now, ctx.bucket_ms)
    redis.call('ZREM', ctx.tag .. 'sr:' .. r[R_SCHEDULE], run_id)
  end
  event_emit(ctx.events_key, ctx.event_cap, 'e', 'skipped', 'id', run_id, 'tenant', tenant,
    'at', ctx.now, 'due_ms', fire, 'reason', reason)
end

-- The options a schedule gives its runs (its opts JSON) as a new table, {} for none.
local function schedule_opts(s)
  if s.opts and s.opts ~= '' then
    return cjson.decode(s.opts)
  end
  return {}
end

-- Materialize fire times `fires` (ascending) of schedule s (a table of its hash fields)
-- whose next fire time after the last is `after` (-1 = none). A fire time already
-- missed by more than misfire_ms follows the catchup policy. Materializing an existing
-- run id is a no-op. Returns runs added, fire times skipped.
local function schedule_plan(ctx, sid, s, fires, after)
  local tag = ctx.tag
  local base = schedule_opts(s)
  base.catchup, base.window_ms, base.overlap = s.catchup, tonumber(s.window_ms), s.overlap
  local offset = tonumber(base.jitter_offset_ms) or 0
  base.jitter_s, base.jitter_offset_ms = nil, nil  -- the schedule's, not each run's
  -- The opts JSON of every run is this object plus its own next_ms: encode it once.
  local head = string.sub(cjson.encode(base), 1, -2) .. ',"next_ms":'
  local added, skipped = 0, 0
  for i = 1, #fires do
    local fire = fires[i]
    local due = fire + offset
    local nxt = fires[i + 1] or after
    if nxt >= 0 then
      nxt = nxt + offset
    end
    local run_id = sid .. '@' .. fire
    base.next_ms = nxt
    if not schedule_runs_late(base, due, ctx.now, ctx.misfire_ms) then
      schedule_skip(ctx, run_id, s.tenant, due, 'misfire')
      skipped = skipped + 1
    else
      local rec = record_pack({ ST_SCHEDULED, 0, due, s.tenant, s.queue, ctx.now, s.payload,
        head .. string.format('%d', nxt) .. '}', nil, nil, sid, nil })
      if record_create(tag, run_id, rec) == 1 then
        if wheel_place(tag, tag .. 'meta', run_id, s.tenant, due, ctx.bucket_ms) == 1 then
          ctx.wake = 1
        end
        redis.call('ZADD', tag .. 'sr:' .. sid, due, run_id)
        added = added + 1
      end
    end
  end
  return added, skipped
end

-- Remove the schedule's materialized runs that are still scheduled (update, pause,
-- delete). Returns the earliest fire time removed (or nil) and how many were removed.
local function schedule_drop_pending(tag, sid, bucket_ms)
  local srkey = tag .. 'sr:' .. sid
  local earliest, dropped = nil, 0
  local members = redis.call('ZRANGE', srkey, 0, -1, 'WITHSCORES')
  for i = 1, #members, 2 do
    local run_id, fire = members[i], tonumber(members[i + 1])
    local r, bkey = record_find(tag, run_id)
    if r and r[R_STATE] == ST_SCHEDULED and r[R_ATTEMPT] == 0 then
      wheel_remove(tag, run_id, r[R_TENANT], r[R_DUE], bucket_ms, r[R_QUEUE])
      record_delete(bkey, run_id)
      dropped = dropped + 1
      if earliest == nil or fire < earliest then
        earliest = fire
      end
    end
  end
  redis.call('DEL', srkey)
  return earliest, dropped
end

-- A run in flight: dispatched, or back in the wheel for a retry.
local function schedule_run_live(tag, run_id)
  local r = record_find(tag, run_id)
  return r ~= nil and (r[R_STATE] == ST_DISPATCHED or (r[R_STATE] == ST_SCHEDULED and
    r[R_ATTEMPT] > 0))
end

-- A schedule's run reached a final state (succeeded, dead): it is no longer in flight,
-- and a run held by overlap buffer_one is released, due now. Returns 1 if that made the
-- released run the shard's next action (the caller wakes the scheduler), else 0.
local function schedule_run_finished(tag, sid, run_id, now, bucket_ms)
  if not sid then
    return 0
  end
  local skey = schedule_key(tag, sid)
  if redis.call('HGET', skey, 'inflight') ~= run_id then
    return 0
  end
  redis.call('HDEL', skey, 'inflight')
  local held = redis.call('HGET', skey, 'held')
  if not held then
    return 0
  end
  local h, hkey = record_find(tag, held)  -- while still held: out of the wheel, not sent
  redis.call('HDEL', skey, 'held')
  if h and h[R_STATE] == ST_SCHEDULED then
    h[R_DUE], h[R_UPDATED] = now, now
    record_save(hkey, held, h)
    return wheel_place(tag, tag .. 'meta', held, h[R_TENANT], now, bucket_ms)
  end
  return 0
end

-- The tick's checks before a schedule's run goes out. Returns true to dispatch it now;
-- false when it was skipped (misfire, overlap) or held (overlap buffer_one).
-- The common case (on time, overlap allow) decodes nothing and writes one field.
local function schedule_admit(ctx, bkey, run_id, r)
  local sid = r[R_SCHEDULE]
  local opts = r[R_OPTS]
  if string.find(opts, '"origin":', 1, true) then
    return true
  end
  local late = r[R_ATTEMPT] == 0 and ctx.now - r[R_DUE] > ctx.misfire_ms
  if not late and string.find(opts, '"overlap":"allow"', 1, true) then
    redis.call('HSET', schedule_key(ctx.tag, sid), 'last_ms', r[R_DUE])
    return true
  end
  local o = cjson.decode(opts)
  if late and not schedule_runs_late(o, r[R_DUE], ctx.now, ctx.misfire_ms) then
    schedule_skip(ctx, run_id, r[R_TENANT], r[R_DUE], 'misfire', bkey, r)
    return false
  end
  local skey = schedule_key(ctx.tag, sid)
  if o.overlap == 'skip' or o.overlap == 'buffer_one' then
    local inflight = redis.call('HGET', skey, 'inflight')
    -- ctx.sent: runs this tick call sent, still in the near level until its batch ends.
    if inflight and inflight ~= run_id and ((ctx.sent and ctx.sent[inflight])
        or schedule_run_live(ctx.tag, inflight)) then
      if o.overlap == 'buffer_one' then
        local held = redis.call('HGET', skey, 'held')
        local h = held and record_find(ctx.tag, held)
        if not h or held == run_id or h[R_STATE] ~= ST_SCHEDULED then
          -- Held out of the wheel, still scheduled, until the run in flight finishes.
          redis.call('HSET', skey, 'held', run_id)
          redis.call('ZREM', ctx.tag .. 'sr:' .. sid, run_id)
          event_emit(ctx.events_key, ctx.event_cap, 'e', 'held', 'id', run_id, 'tenant',
            r[R_TENANT], 'at', ctx.now, 'due_ms', r[R_DUE], 'reason', 'overlap')
          return false
        end
      end
      schedule_skip(ctx, run_id, r[R_TENANT], r[R_DUE], 'overlap', bkey, r)
      return false
    end
    redis.call('HSET', skey, 'inflight', run_id, 'last_ms', r[R_DUE])
  else
    redis.call('HSET', skey, 'last_ms', r[R_DUE])
  end
  return true
end

-- The schedule's hash as a table, or nil.
local function schedule_load(skey)
  local flat = redis.call('HGETALL', skey)
  if #flat == 0 then
    return nil
  end
  return hash_table(flat)
end

-- A tenant's schedule as a table (schedule_load), or nil: none, or another tenant's.
local function schedule_owned(skey, tenant)
  local s = schedule_load(skey)
  if s == nil or s.tenant ~= tenant then
    return nil
  end
  return s
end

-- Parse a comma-separated list of fire times ('' = none).
local function schedule_fires(list)
  local out = {}
  for v in string.gmatch(list, '[^,]+') do
    out[#out + 1] = tonumber(v)
  end
  return out
end

-- Plan fires into an active schedule and move its cursor: at most max_runs runs in all
-- (0 = no limit); the schedule ends when no fire time is left (after = -1) or max_runs
-- is reached, else it waits in the plan index for its next fire time.
-- Returns runs added, fire times skipped.
local function schedule_extend(ctx, sid, skey, s, fires, after)
  local planned, max_runs = tonumber(s.planned) or 0, tonumber(s.max_runs) or 0
  if max_runs > 0 and #fires > max_runs - planned then
    local cut = {}
    for i = 1, math.max(0, max_runs - planned) do
      cut[i] = fires[i]
    end
    if #cut < #fires then
      after = -1
    end
    fires = cut
  end
  local added, skipped = schedule_plan(ctx, sid, s, fires, after)
  redis.call('ZREMRANGEBYSCORE', ctx.tag .. 'sr:' .. sid, '-inf',
    '(' .. (ctx.now - ctx.misfire_ms - 3600000))
  planned = planned + added
  local cursor = s.cursor
  if #fires > 0 then
    cursor = fires[#fires]
  end
  local state = 'active'
  if after < 0 or (max_runs > 0 and planned >= max_runs) then
    state = 'ended'
    schedule_unindex(ctx.tag, s.tenant, sid)
  else
    schedule_index(ctx.tag, s.tenant, sid, after)
  end
  redis.call('HSET', skey, 'planned', planned, 'cursor', cursor, 'next_ms', after, 'state', state)
  return added, skipped
end
