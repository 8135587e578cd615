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
--       policies met so far, by opts), retried (see retry_flush), field (the run's
--       field in bkey), raw (its record as stored: a retry patches it, record_retried),
--       now_packed (cmsgpack.pack(now)), heads (a table of record_retried's; the
--       packed error of the last retry is kept beside, packed_error and error_packed), the
--       event log's archive mark as meta holds it, archived and archive_cap (false: none).
--   retry_flush(tag, ctx)   what the retries collected in ctx.retried ({runs = {},
--       errors = {}, near = {}, marks = {}, n = 0, wake = 0}) share: the runs due before
--       promoted_until go into the near level with one ZADD per tenant, then one
--       retry_scheduled entry for the call (docs/design.md, the event log) and one wake
--       message at most. Until then those runs are in neither level: the caller answers a
--       second report of a run it already handled as stale without reading it.
--
-- policy: the task's own retry fields (record opts JSON, key 'retry') over the
-- deployment defaults (a table with max_attempts, initial_s, factor, max_s, jitter).
-- rand: a number in [0, 1) from the caller (or drawn from the caller's seed: run_fail,
-- dispatch_reap); Redis seeds Lua's math.random identically on every call, so randomness
-- has to come from outside.

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
  local ms = d * 1000
  return ms - ms % 1  -- math.floor(ms), without a call
end

-- Move a run that was dispatched and failed: back into the wheel, or into the tenant's
-- dead-letter stream once max_attempts is reached (or at once when permanent). A buried
-- run stops counting in the tenant's queue; its payload, now held by the dead
-- letter, counts in bytes until replay or purge (lib/usage.lua).
-- Returns 'retry', due_ms   or   'dead', entry_id.
local function retry_or_bury(tag, bkey, run_id, r, ctx)
  local c = lib_c
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
  if not ctx.permanent and r[R_ATTEMPT] < p.max_attempts then
    local delay = ctx.delay_ms or retry_backoff_ms(p, r[R_ATTEMPT], ctx.rand)
    local due = now + delay
    r[R_STATE], r[R_DUE] = ST_SCHEDULED, due
    local batch = ctx.retried
    local wake = 0
    if batch then
      -- One integer format, for the event's run list and the near level's score.
      local due_text = c.format('%d', due)
      if due < ctx.promoted_until then
        local placed = batch.near[tenant]
        if placed == nil then
          placed = { earliest = due, n = 0 }
          batch.near[tenant] = placed
        elseif due < placed.earliest then
          placed.earliest = due
        end
        local k = placed.n
        -- The score as text (an integer, as due always is but for a test's clock).
        placed[k + 1], placed[k + 2], placed.n = due % 1 == 0 and due_text or due, run_id, k + 2
      else
        wake = wheel_place(tag, tag .. 'meta', run_id, tenant, due, ctx.bucket_ms,
          ctx.promoted_until)
      end
      local out = nil
      if ctx.raw then
        -- The error packed once while the runs of a call report the same one.
        if ctx.error ~= ctx.packed_error then
          ctx.packed_error, ctx.error_packed = ctx.error, c.pack(ctx.error)
        end
        out = record_retried(ctx.raw, r, due, c.pack(due), ctx.now_packed, ctx.error_packed,
          ctx.heads)
      end
      if out then
        c.call('HSET', bkey, ctx.field, out)
      else
        r[R_ERROR], r[R_UPDATED] = ctx.error, now
        record_save(bkey, run_id, r, ctx.field)
      end
      local attempt = r[R_ATTEMPT]
      local mark = batch.marks[attempt]
      if mark == nil then
        mark = ':' .. string.format('%d', attempt) .. ':'
        batch.marks[attempt] = mark
      end
      local n = batch.n + 1
      batch.n = n
      batch.runs[n] = run_id .. ':' .. tenant .. mark .. due_text
      batch.errors[n] = ctx.error
      if wake == 1 then
        batch.wake = 1
      end
      return 'retry', due
    end
    r[R_ERROR], r[R_UPDATED] = ctx.error, now
    wake = wheel_place(tag, tag .. 'meta', run_id, tenant, due, ctx.bucket_ms, ctx.promoted_until)
    record_save(bkey, run_id, r, ctx.field)
    wake_publish(wake, ctx.wake_channel, ctx.shard)
    event_emit(ctx.events_key, ctx.event_cap, 'e', 'retry_scheduled', 'id', run_id,
      'tenant', tenant, 'attempt', r[R_ATTEMPT], 'at', now, 'due_ms', due,
      'reason', ctx.reason, 'error', ctx.error)
    return 'retry', due
  end
  r[R_ERROR], r[R_UPDATED] = ctx.error, now
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
  local n = batch.n
  if n == 0 then
    return
  end
  for tenant, placed in pairs(batch.near) do
    if wheel_place_near(tag, tenant, placed, placed.n, placed.earliest) == 1 then
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
  local k, cap = ctx.events_key, event_cap_for(ctx.event_cap, n)
  local at = string.format('%d', ctx.now)
  if same then
    event_emit_marked(k, cap, ctx.archived, ctx.archive_cap, 'e', 'retry_scheduled', 'runs', runs,
      'at', at, 'reason', ctx.reason, 'error', errors[1])
  else
    event_emit_marked(k, cap, ctx.archived, ctx.archive_cap, 'e', 'retry_scheduled', 'runs', runs,
      'at', at, 'reason', ctx.reason, 'errors', cjson.encode(errors))
  end
end
