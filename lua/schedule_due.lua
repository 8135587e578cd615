--[[ schedule_due: the schedules a planner pass extends, shared out between tenants.
  KEYS[1] plan_tenants  ZSET   tag..'plan_tenants': tenant -> earliest next_ms of its index
  ARGV[1] until_ms: schedules whose next fire time to plan is at or before it are due
  ARGV[2] most schedules in all (<= 1000)   ARGV[3] most tenants visited (<= 1000)
  Derived keys (same tag): plan:<tenant>, s:<sid>; plan (an earlier version's index).
  Returns: {more, n, then n rows of tenant, sid, next_ms, spec, cursor, version}: due
           active schedules; more = 1: a tenant (or tenants past ARGV[3]) had more due.
           An indexed schedule that is gone or not active is taken out of the index.
  Errors:  none.
  Fair share: the due tenants are visited earliest first, each taking up to
  max(1, floor(ARGV[2] / tenants due)) of its own earliest schedules, so one tenant
  with many schedules (or far behind) gets one share of the pass and others the rest.
  An index left by an earlier library version (tag..'plan', sid -> next_ms) is moved
  into the per-tenant index, up to LEGACY_MOVES entries per call, before reading. ]]
local rcall = redis.call
local tenants_key = KEYS[1]
local until_ms, most, most_tenants = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local tag = string.sub(tenants_key, 1, -13)
-- Bounded: one call moves at most this many legacy entries (a few ms of Redis time).
local LEGACY_MOVES = 500

--!include lib/schedule.lua

local legacy = tag .. 'plan'
local old = rcall('ZRANGE', legacy, 0, LEGACY_MOVES - 1, 'WITHSCORES')
for i = 1, #old, 2 do
  local sid, next_ms = old[i], old[i + 1]
  local owner = rcall('HMGET', schedule_key(tag, sid), 'tenant', 'state')
  if owner[1] and owner[2] == 'active' then
    rcall('ZADD', tag .. 'plan:' .. owner[1], next_ms, sid)
    schedule_index_head(tag, owner[1])
  end
  rcall('ZREM', legacy, sid)
end

local due = rcall('ZRANGE', tenants_key, '-inf', until_ms, 'BYSCORE', 'LIMIT', 0, most_tenants)
local out = { 0, 0 }
if #due == 0 then
  return out
end
if #due >= most_tenants then
  out[1] = 1
end
local share = math.max(1, math.floor(most / #due))
local n = 0
for _, tenant in ipairs(due) do
  local sids = rcall('ZRANGE', tag .. 'plan:' .. tenant, '-inf', until_ms, 'BYSCORE', 'LIMIT', 0,
    share, 'WITHSCORES')
  if #sids >= 2 * share then
    out[1] = 1
  end
  for i = 1, #sids, 2 do
    local sid = sids[i]
    local s = rcall('HMGET', schedule_key(tag, sid), 'spec', 'cursor', 'version', 'state')
    if s[1] and s[4] == 'active' then
      out[#out + 1] = tenant
      out[#out + 1] = sid
      out[#out + 1] = sids[i + 1]
      out[#out + 1] = s[1]
      out[#out + 1] = s[2]
      out[#out + 1] = s[3]
      n = n + 1
    else
      -- Gone or no longer active (a script that left it indexed): nothing to plan.
      schedule_unindex(tag, tenant, sid)
    end
  end
end
out[2] = n
return out
