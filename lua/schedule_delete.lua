--[[ schedule_delete: remove a schedule and its runs not yet dispatched (runs in flight
  finish and keep their history).
  KEYS[1] meta      HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] schedule  HASH   tag..'s:'..sid
  KEYS[3] events    STREAM tag..'events'
  ARGV[1] sid   ARGV[2] tenant   ARGV[3] bucket_ms   ARGV[4] now_ms override ('' = TIME)
  ARGV[5] event log cap
  Derived keys (same tag): schedules, sr:<sid>, plan_tenants, plan:<tenant>, t:<xy>, near:<tenant>, w:<bucket>, wheel,
  x:<bucket>, expiry, use:<tenant> (the schedule stops counting in schedules, bytes and
  q:<queue>; lib/usage.lua).
  Returns: {1, dropped}   deleted; dropped = materialized runs removed with it
  Errors:  {-1} NOT_FOUND     no such schedule for this tenant ]]
local rcall = redis.call
local meta_key, skey, events_key = KEYS[1], KEYS[2], KEYS[3]
local sid, tenant, bucket_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now_override, event_cap = ARGV[4], ARGV[5]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/usage.lua
--!include lib/events.lua
--!include lib/schedule.lua

local s = schedule_owned(skey, tenant)
if s == nil then
  return { -1 }
end
local now = clock_now_ms(now_override)
local _, dropped = schedule_drop_pending(tag, sid, bucket_ms)
if s.held then
  -- A run held back by overlap buffer_one is out of the wheel: cancel it.
  local h, hkey = record_find(tag, s.held)
  if h and h[R_STATE] == ST_SCHEDULED then
    h[R_STATE], h[R_UPDATED] = ST_CANCELLED, now
    record_save(hkey, s.held, h)
    wheel_retain(tag, s.held, now, bucket_ms)
    dropped = dropped + 1
  end
end
rcall('DEL', skey)
schedule_unindex(tag, tenant, sid)
rcall('SREM', tag .. 'schedules', sid)
local ukey = usage_key(tag, tenant)
usage_add(ukey, 'schedules', -1)
usage_add(ukey, 'bytes', -#s.payload)
usage_add(ukey, 'q:' .. s.queue, -1)
event_emit(events_key, event_cap, 'e', 'schedule_deleted', 'id', sid, 'tenant', tenant, 'at', now)
return { 1, dropped }
