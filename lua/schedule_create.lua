--[[ schedule_create: store a new recurring schedule and materialize its first runs.
  KEYS[1] meta      HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] schedule  HASH   tag..'s:'..sid
  KEYS[3] events    STREAM tag..'events'
  ARGV[1] sid   ARGV[2] tenant   ARGV[3] queue   ARGV[4] payload (JSON text)
  ARGV[5] opts (JSON text of run options, '' = none)   ARGV[6] spec (JSON text, kept
          for the planner)   ARGV[7] catchup   ARGV[8] catchup window ms   ARGV[9] overlap
  ARGV[10] max_runs (0 = none)   ARGV[11] paused ('1'/'0')   ARGV[12] idempotent ('1')
  ARGV[13] cursor: fire times after it are the schedule's   ARGV[14] fire times to
  materialize now, ascending, comma-separated   ARGV[15] the next fire time after them
  (-1 = none)   ARGV[16] bucket_ms   ARGV[17] misfire_ms   ARGV[18] now_ms override
  ARGV[19] event log cap   ARGV[20] wake channel ('' = none)   ARGV[21] shard number
  Derived keys (same tag): schedules, sr:<sid>, plan_tenants, plan:<tenant>, t:<xy>, near:<tenant>, due,
  w:<bucket>, wheel, use:<tenant> (the schedule counts in schedules, bytes and
  q:<queue>; lib/usage.lua).
  Returns: {1, added, wake}   created; wake = 1 if the shard's next action moved earlier
           {0}                an idempotent duplicate of this tenant's: nothing changed
  Errors:  an error reply on an id collision with another tenant's schedule. ]]
local rcall = redis.call
local meta_key, skey, events_key = KEYS[1], KEYS[2], KEYS[3]
local sid, tenant, queue, payload, opts, spec = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5],
  ARGV[6]
local catchup, window_ms, overlap, max_runs = ARGV[7], ARGV[8], ARGV[9], ARGV[10]
local paused, idempotent, cursor = ARGV[11] == '1', ARGV[12] == '1', ARGV[13]
local fires_text, after = ARGV[14], tonumber(ARGV[15])
local bucket_ms, misfire_ms, now_override = tonumber(ARGV[16]), tonumber(ARGV[17]), ARGV[18]
local event_cap, wake_channel, shard = ARGV[19], ARGV[20], ARGV[21]
local tag = string.sub(meta_key, 1, -5)

--!include lib/clock.lua
--!include lib/usage.lua
--!include lib/wake.lua
--!include lib/events.lua
--!include lib/schedule.lua

local existing = rcall('HGET', skey, 'tenant')
if existing then
  if idempotent and existing == tenant then
    return { 0 }
  end
  return redis.error_reply('ERR timewheel: schedule id collision ' .. sid)
end
local now = clock_now_ms(now_override)
local s = { tenant = tenant, queue = queue, payload = payload, opts = opts, spec = spec,
  catchup = catchup, window_ms = window_ms, overlap = overlap, max_runs = max_runs,
  cursor = cursor, planned = 0 }
rcall('HSET', skey, 'tenant', tenant, 'queue', s.queue, 'payload', s.payload, 'opts', s.opts,
  'spec', s.spec, 'catchup', s.catchup, 'window_ms', s.window_ms, 'overlap', s.overlap,
  'max_runs', s.max_runs, 'cursor', s.cursor, 'planned', 0, 'created_ms', now,
  'updated_ms', now, 'version', 1)
rcall('SADD', tag .. 'schedules', sid)
local ukey = usage_key(tag, tenant)
usage_add(ukey, 'schedules', 1)
usage_add(ukey, 'bytes', #payload)
usage_add(ukey, 'q:' .. queue, 1)
local ctx = schedule_ctx(tag, now, bucket_ms, misfire_ms, events_key, event_cap)
local fires = schedule_fires(fires_text)
local added = 0
if paused then
  -- Paused from the start: nothing materialized; resume plans from the cursor.
  local first = fires[1] or after
  rcall('HSET', skey, 'state', 'paused', 'next_ms', first, 'paused_ms', now)
else
  added = schedule_extend(ctx, sid, skey, s, fires, after)
end
event_emit(events_key, event_cap, 'e', 'schedule_created', 'id', sid, 'tenant', tenant,
  'at', now)
wake_publish(ctx.wake, wake_channel, shard)
return { 1, added, ctx.wake }
