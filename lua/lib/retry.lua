-- Retry or bury a run whose attempt failed (run_fail.lua, dispatch_reap.lua, and the
-- tick for a run past its expires_at). Calls lib/record.lua, lib/usage.lua, lib/wheel.lua,
-- lib/wake.lua, lib/events.lua, lib/dead.lua and lib/schedule.lua (before it in LIBS).
--
--   retry_policy(r, defaults) -> p   the retry policy of a run.
--   retry_backoff_ms(p, attempt, rand) -> ms   the wait before the next attempt.
--   retry_or_bury(tag, bkey, run_id, r, ctx) -> 'retry', due_ms | 'dead', entry_id
--       ctx: now, defaults, error, reason, permanent, delay_ms (nil = backoff), rand,
--       bucket_ms, events_key, event_cap, and wake_channel, shard (optional); and for a
--       call reporting many runs (run_fail), promoted_until, policies (a table of the
--       policies met so far, by opts), retried (see retry_flush) and field (the run's
--       field in bkey).
--   retry_flush(tag, ctx)   what the retries collected in ctx.retried ({runs = {},
--       errors = {}, near = {}, wake = 0}) share: the runs due before promoted_until go
--       into the near level with one ZADD per tenant, then one retry_scheduled entry for
--       the call (docs/design.md, the event log) and one wake message at most. Until
--       then those runs are in neither level: the caller answers a second report of a
--       run it already handled as stale without reading it.
--
-- policy: the task's own retry fields (record opts JSON, key 'retry') over the
-- deployment defaults (a table with max_attempts, initial_s, factor, max_s, jitter).
-- rand: a number in [0, 1) from the caller; Redis seeds Lua's math.random identically
-- on every call, so randomness has to come from outside.

local function retry_policy(r, defaults)
  local p = {}
  for k, v in pairs(defaults) do
    p[k] = v
  end
  if r[R_OPTS] then
    local opts = cjson.decode(r[R_OPTS])
    if type(opts.retry) == 'table' then
      for k, v in pairs(opts.retry) do
        p[k] = v
      end
    end
  end
  return p
end

-- Backoff before the next attempt, in ms: exponential from initial_s by factor per
-- attempt, capped at max_s, then jittered: 'full' is uniform in [0, d], 'proportional'
-- is d * [0.8, 1.2), 'none' is d.
local function retry_backoff_ms(p, attempt, rand)
  local d = p.initial_s * (p.factor ^ (attempt - 1))
  if d > p.max_s then
    d = p.max_s
  end
  if p.jitter == 'full' then
    d = d * rand
  elseif p.jitter == 'proportional' then
    d = d * (0.8 + 0.4 * rand)
  end
  return math.floor(d * 1000)
end

-- Move a run that was dispatched and failed: back into the wheel, or into the tenant's
-- dead-letter stream once max_attempts is reached (or at once when permanent). A buried
-- run stops counting in the tenant's queue; its payload, now held by the dead
-- letter, counts in bytes until replay or purge (lib/usage.lua).
-- Returns 'retry', due_ms   or   'dead', entry_id.
local function retry_or_bury(tag, bkey, run_id, r, ctx)
  local now, p = ctx.now, nil
  if ctx.policies then
    local opts = r[R_OPTS] or ''
    p = ctx.policies[opts]
    if p == nil then
      p = retry_policy(r, ctx.defaults)
      ctx.policies[opts] = p
    end
  else
    p = retry_policy(r, ctx.defaults)
  end
  local tenant = r[R_TENANT]
  r[R_ERROR], r[R_UPDATED] = ctx.error, now
  if not ctx.permanent and r[R_ATTEMPT] < p.max_attempts then
    local delay = ctx.delay_ms or retry_backoff_ms(p, r[R_ATTEMPT], ctx.rand)
    r[R_STATE], r[R_DUE] = ST_SCHEDULED, now + delay
    local batch = ctx.retried
    local wake = 0
    if batch and r[R_DUE] < ctx.promoted_until then
      local placed = batch.near[tenant]
      if placed == nil then
        placed = {}
        batch.near[tenant] = placed
      end
      placed[#placed + 1], placed[#placed + 2] = r[R_DUE], run_id
    else
      wake = wheel_place(tag, tag .. 'meta', run_id, tenant, r[R_DUE], ctx.bucket_ms,
        ctx.promoted_until)
    end
    record_save(bkey, run_id, r, ctx.field)
    if batch then
      local n = #batch.runs + 1
      batch.runs[n] = string.format('%s:%s:%d:%d', run_id, tenant, r[R_ATTEMPT], r[R_DUE])
      batch.errors[n] = ctx.error
      if wake == 1 then
        batch.wake = 1
      end
      return 'retry', r[R_DUE]
    end
    wake_publish(wake, ctx.wake_channel, ctx.shard)
    event_emit(ctx.events_key, ctx.event_cap, 'e', 'retry_scheduled', 'id', run_id,
      'tenant', tenant, 'attempt', r[R_ATTEMPT], 'at', now, 'due_ms', r[R_DUE],
      'reason', ctx.reason, 'error', ctx.error)
    return 'retry', r[R_DUE]
  end
  local entry = dead_letter(tag, run_id, r, ctx.reason, ctx.error, now)
  r[R_STATE], r[R_DEAD] = ST_DEAD, entry
  record_save(bkey, run_id, r, ctx.field)
  if usage_counted(r) then
    usage_run(usage_key(tag, tenant), r, -1, 0)
  else
    usage_run(usage_key(tag, tenant), r, 0, 1)
  end
  wake_publish(schedule_run_finished(tag, r[R_SCHEDULE], run_id, now, ctx.bucket_ms),
    ctx.wake_channel, ctx.shard)
  event_emit(ctx.events_key, ctx.event_cap, 'e', 'dead', 'id', run_id, 'tenant', tenant,
    'attempt', r[R_ATTEMPT], 'at', now, 'reason', ctx.reason, 'error', ctx.error)
  return 'dead', entry
end

-- One retry_scheduled entry for the retries a call collected: runs
-- 'id:tenant:attempt:due_ms,...',
-- and the error once when every retry has the same, else errors: a JSON array in the order
-- of runs.
local function retry_flush(tag, ctx)
  local batch = ctx.retried
  local n = #batch.runs
  if n == 0 then
    return
  end
  for tenant, placed in pairs(batch.near) do
    if wheel_place_near(tag, tenant, placed) == 1 then
      batch.wake = 1
    end
  end
  wake_publish(batch.wake, ctx.wake_channel, ctx.shard)
  local errors, same = batch.errors, true
  for i = 2, n do
    if errors[i] ~= errors[1] then
      same = false
      break
    end
  end
  local runs = table.concat(batch.runs, ',')
  if same then
    event_emit(ctx.events_key, ctx.event_cap, 'e', 'retry_scheduled', 'runs', runs, 'at', ctx.now,
      'reason', ctx.reason, 'error', errors[1])
  else
    event_emit(ctx.events_key, ctx.event_cap, 'e', 'retry_scheduled', 'runs', runs, 'at', ctx.now,
      'reason', ctx.reason, 'errors', cjson.encode(errors))
  end
end
