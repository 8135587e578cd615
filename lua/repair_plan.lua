--[[ repair_plan: put an active schedule the audit found missing from its plan index back in
  it, at its next fire time to plan (timewheel audit --repair; docs/operations/auditing.md).
  KEYS[1] schedule  HASH tag..'s:'..sid (the tag is KEYS[1] up to '}:')
  ARGV[1] sid
  Derived keys (same tag): plan:<tenant>, plan_tenants.
  Returns: {1}   indexed (schedule_index: plan:<tenant> and plan_tenants)
           {0}   nothing done: the schedule is gone or not active
  Errors:  none.
  The planner then extends it as any other: materializing a fire time twice is a no-op,
  and fire times it missed follow its catchup policy. Nothing is deleted. ]]
local skey = KEYS[1]
local sid = ARGV[1]
local tag = string.match(skey, '^(.-}:)')

--!include lib/schedule.lua

local s = redis.call('HMGET', skey, 'tenant', 'state', 'next_ms')
if not s[1] or s[2] ~= 'active' or not tonumber(s[3]) then
  return { 0 }
end
schedule_index(tag, s[1], sid, tonumber(s[3]))
return { 1 }
