--[[ repair_usage: set one field of a tenant's usage hash to what the audit's records phase
  found, if neither the field nor the tenant moved since the audit read them (timewheel
  audit --repair; docs/operations/auditing.md, usage_mismatch).
  KEYS[1] usage   HASH   the tenant's usage hash in the shard (lib/usage.lua)
  KEYS[2] events  STREAM tag..'events' (the same tag)
  ARGV[1] tenant   ARGV[2] field (q:<queue>, schedules or bytes)
  ARGV[3] the count the records gave (the value to set)
  ARGV[4] the field's value as the audit read it ('' = the field was missing)
  ARGV[5] the event-log entry id read when the records phase began ('0-0': the log was
          empty)   ARGV[6] most event-log entries after it to read
  Returns: {1}             set (a q:<queue> of 0 is deleted, as lib/usage.lua leaves it)
           {0, 'changed'}  nothing done: the field no longer holds the value read
           {0, 'moved on'} nothing done: an event after ARGV[5] names the tenant, so its
                           counts may have moved since the records were read
           {0, 'busy'}     nothing done: more than ARGV[6] entries follow ARGV[5], or the
                           log no longer holds ARGV[5] (trimmed past it), so whether an
                           event named the tenant cannot be told
  Errors:  none.
  Every operation that changes a tenant's usage names the tenant in the event it writes in
  the same call (lib/usage.lua), so with no such event since the records phase began the
  records still give what they gave. An entry names the tenant when one of its values is
  the tenant's name or holds it between ':' and ',' (a batched entry's runs); a name that
  only looks like it refuses a repair, never lets one through. Writes no event (a second
  field of the same tenant stays repairable); nothing else is changed. ]]
local rcall = redis.call
local ukey, events_key = KEYS[1], KEYS[2]
local tenant, field, expected, read = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local since, most = ARGV[5], tonumber(ARGV[6])

local current = rcall('HGET', ukey, field)
if (current or '') ~= read then
  return { 0, 'changed' }
end

local function names(value, at)
  local n = #tenant
  while true do
    local i = string.find(value, tenant, at, true)
    if i == nil then
      return false
    end
    local before, after = string.sub(value, i - 1, i - 1), string.sub(value, i + n, i + n)
    if (i == 1 or before == ':' or before == ',')
        and (after == '' or after == ':' or after == ',') then
      return true
    end
    at = i + 1
  end
end

if since == '0-0' then
  -- The log was empty: every entry it holds came after, unless some were trimmed.
  if rcall('EXISTS', events_key) == 1 then
    local info = rcall('XINFO', 'STREAM', events_key)
    local added
    for i = 1, #info, 2 do
      if info[i] == 'entries-added' then
        added = info[i + 1]
      end
    end
    if added == nil or added ~= rcall('XLEN', events_key) then
      return { 0, 'busy' }
    end
  end
elseif #rcall('XRANGE', events_key, since, since) == 0 then
  return { 0, 'busy' }
end
local entries = rcall('XRANGE', events_key, '(' .. since, '+', 'COUNT', most + 1)
if #entries > most then
  return { 0, 'busy' }
end
for _, entry in ipairs(entries) do
  local fields = entry[2]
  for i = 2, #fields, 2 do
    if names(fields[i], 1) then
      return { 0, 'moved on' }
    end
  end
end
if string.sub(field, 1, 2) == 'q:' and tonumber(expected) == 0 then
  rcall('HDEL', ukey, field)
else
  rcall('HSET', ukey, field, expected)
end
return { 1 }
