--[[ dead_purge: delete a dead-lettered run: its dead-letter entry and its record.
  KEYS[1] dead    STREAM tag..'dead:'..tenant (the tag is KEYS[1] up to '}:')
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] run_id   ARGV[2] tenant   ARGV[3] now_ms override ('' = TIME)   ARGV[4] event log cap
  Derived keys (same tag): t:<xy>, use:<tenant> (the payload stops counting in bytes;
  lib/usage.lua).
  Returns: {1}   purged
  Errors:  {-1} NOT_FOUND: no dead-lettered run with this id for this tenant. ]]
local dead_key, events_key = KEYS[1], KEYS[2]
local run_id, tenant, now_override, event_cap = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local tag = string.match(dead_key, '^(.-}:)')

--!include lib/record.lua
--!include lib/dead.lua
--!include lib/usage.lua
--!include lib/clock.lua
--!include lib/events.lua

local r, bkey = dead_take(tag, dead_key, run_id, tenant)
if r == nil then
  return { -1 }
end
record_delete(bkey, run_id)
usage_run(usage_key(tag, tenant), r, 0, -1)
event_emit(events_key, event_cap, 'e', 'purged', 'id', run_id, 'tenant', tenant,
  'at', clock_now_ms(now_override))
return { 1 }
