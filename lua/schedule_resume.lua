--[[ schedule_resume: a paused schedule becomes active; the planner plans from its cursor,
  so fire times of the paused span follow the catchup policy (skip, latest, all).
  KEYS[1] schedule  HASH   tag..'s:'..sid (the tag is KEYS[1] up to '}:')
  KEYS[2] events    STREAM tag..'events'
  ARGV[1] sid   ARGV[2] tenant   ARGV[3] now_ms override ('' = TIME)   ARGV[4] event log cap
  Derived keys (same tag): plan_tenants, plan:<tenant>.
  Returns: {1}   active again (or already active)
  Errors:  {-1} NOT_FOUND     no such schedule for this tenant
           {-2, state}        INVALID_STATE: the schedule has ended ]]
local rcall = redis.call
local skey, events_key = KEYS[1], KEYS[2]
local sid, tenant, now_override, event_cap = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local tag = string.match(skey, '^(.-}:)')

--!include lib/clock.lua
--!include lib/events.lua
--!include lib/schedule.lua

local s = rcall('HMGET', skey, 'tenant', 'state', 'next_ms')
if s[1] ~= tenant then
  return { -1 }
end
if s[2] == 'ended' then
  return { -2, s[2] }
end
if s[2] == 'active' then
  return { 1 }
end
local now = clock_now_ms(now_override)
rcall('HINCRBY', skey, 'version', 1)
rcall('HDEL', skey, 'paused_ms')
local next_ms = tonumber(s[3]) or -1
if next_ms < 0 then
  rcall('HSET', skey, 'state', 'ended', 'updated_ms', now)
else
  rcall('HSET', skey, 'state', 'active', 'updated_ms', now)
  schedule_index(tag, tenant, sid, next_ms)
end
event_emit(events_key, event_cap, 'e', 'schedule_resumed', 'id', sid, 'tenant', tenant, 'at', now)
return { 1 }
