--[[ dead_replay: move a dead-lettered run back into the wheel, due now, attempt reset.
  KEYS[1] dead    STREAM tag..'dead:'..tenant (the tag is KEYS[1] up to '}:')
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] run_id   ARGV[2] tenant   ARGV[3] bucket_ms   ARGV[4] now_ms override ('' = TIME)
  ARGV[5] event log cap   ARGV[6] wake channel ('' = none)   ARGV[7] shard number
  ARGV[8] cap ('' or absent = none): the most counted runs not finished (lib/usage.lua,
          usage_held) the shard may hold for the tenant after the call (its share of
          max_pending: timewheel/limits.py)
  Derived keys (same tag): t:<xy>, meta, near:<tenant>, due, w:<bucket>, wheel, use:<tenant>
  (a counted run counts again in its queue; a planned run of a schedule stops
  counting its payload in bytes; lib/usage.lua).
  Returns: {1, due_ms}   scheduled again; its next dispatch says attempt 1
           {3, held, cap}   refused: a counted run that would pass the cap (nothing
                            changed; held = the tenant's counted runs not finished here)
  Errors:  {-1} NOT_FOUND: no dead-lettered run with this id for this tenant. ]]
local dead_key, events_key = KEYS[1], KEYS[2]
local run_id, tenant, bucket_ms, now_override = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local event_cap, wake_channel, shard, cap = ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8] or '')
local tag = string.match(dead_key, '^(.-}:)')

--!include lib/record.lua
--!include lib/dead.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/usage.lua
--!include lib/wake.lua
--!include lib/events.lua

if cap ~= nil then
  local found = record_owned(body_key(tag, run_id), run_id, tenant)
  if found ~= nil and found[R_STATE] == ST_DEAD and usage_counted(found) then
    local held = usage_held(usage_key(tag, tenant))
    if held >= cap then
      return { 3, held, cap }
    end
  end
end
local r, bkey = dead_take(tag, dead_key, run_id, tenant)
if r == nil then
  return { -1 }
end
local now = clock_now_ms(now_override)
r[R_STATE], r[R_ATTEMPT], r[R_DUE], r[R_UPDATED], r[R_DEAD] = ST_SCHEDULED, 0, now, now, nil
local wake = wheel_place(tag, tag .. 'meta', run_id, tenant, now, bucket_ms)
record_save(bkey, run_id, r)
if usage_counted(r) then
  usage_run(usage_key(tag, tenant), r, 1, 0)
else
  usage_run(usage_key(tag, tenant), r, 0, -1)
end
event_emit(events_key, event_cap, 'e', 'replayed', 'id', run_id, 'tenant', tenant, 'at', now)
wake_publish(wake, wake_channel, shard)
return { 1, now }
