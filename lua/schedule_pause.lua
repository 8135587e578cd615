--[[ schedule_pause: stop a schedule: no more runs are materialized, and its materialized
  runs not yet dispatched are dropped (runs in flight finish).
  KEYS[1] meta      HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] schedule  HASH   tag..'s:'..sid
  KEYS[3] events    STREAM tag..'events'
  ARGV[1] sid   ARGV[2] tenant   ARGV[3] bucket_ms   ARGV[4] now_ms override ('' = TIME)
  ARGV[5] event log cap
  Derived keys (same tag): sr:<sid>, plan_tenants, plan:<tenant>, t:<xy>, near:<tenant>, w:<bucket>, wheel.
  Returns: {1}   paused (or already paused)
  Errors:  {-1} NOT_FOUND     no such schedule for this tenant
           {-2, state}        INVALID_STATE: the schedule has ended and all its runs
                              were sent
  The cursor moves back before the earliest dropped run, so resume plans the paused
  span again and its catchup policy decides what of it runs. ]]
local rcall = redis.call
local meta_key, skey, events_key = KEYS[1], KEYS[2], KEYS[3]
local sid, tenant, bucket_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now_override, event_cap = ARGV[4], ARGV[5]
local tag = string.sub(meta_key, 1, -5)

--!include lib/clock.lua
--!include lib/events.lua
--!include lib/schedule.lua

local s = schedule_owned(skey, tenant)
if s == nil then
  return { -1 }
end
if s.state == 'paused' then
  return { 1 }
end
local now = clock_now_ms(now_override)
local earliest, dropped = schedule_drop_pending(tag, sid, bucket_ms)
if s.state == 'ended' and dropped == 0 then
  return { -2, s.state }  -- nothing planned is left to hold back
end
if earliest then
  rcall('HSET', skey, 'cursor', earliest - 1, 'next_ms', earliest)
end
rcall('HINCRBY', skey, 'version', 1)
rcall('HSET', skey, 'state', 'paused', 'paused_ms', now, 'updated_ms', now, 'planned',
  math.max(0, (tonumber(s.planned) or 0) - dropped))
schedule_unindex(tag, tenant, sid)
event_emit(events_key, event_cap, 'e', 'schedule_paused', 'id', sid, 'tenant', tenant, 'at', now)
return { 1 }
