--[[ restore_schedule: write a schedule back into a shard rebuilt from PostgreSQL
  (timewheel restore), from its hash as the archive holds it.
  KEYS[1] schedule  HASH   tag..'s:'..sid (the tag is KEYS[1] up to '}:')
  ARGV[1] sid   ARGV[2] the schedule hash as a flat JSON list [field, value, ...]
  Derived keys (same tag): schedules, plan_tenants, plan:<tenant>, use:<tenant> (the
  schedule counts as create counts it: schedules, bytes, q:<queue>; lib/usage.lua).
  Returns: {1}   written
           {0}   a schedule with this id is there already (left as it is: only a forced
                 restore into a non-empty Redis meets one)
  Errors:  none expected; malformed input is an error reply.
  The planner plans again from the last fire time sent (or the schedule's creation), so
  runs materialized after the snapshot come back (run ids are deterministic: those the
  restore wrote already are not doubled) and fire times missed while Redis was gone follow
  the catchup policy. In-flight and held markers are dropped: those runs were restored as
  scheduled runs and go out again under the same run ids. ]]
local rcall = redis.call
local skey = KEYS[1]
local sid, hash_json = ARGV[1], ARGV[2]
local tag = string.match(skey, '^(.-}:)')

--!include lib/hash.lua
--!include lib/schedule.lua
--!include lib/usage.lua

if rcall('EXISTS', skey) == 1 then
  return { 0 }
end
local flat = cjson.decode(hash_json)
local s = hash_table(flat)
rcall('HSET', skey, unpack(flat))
rcall('HDEL', skey, 'inflight', 'held')
local cursor = tonumber(s.last_ms) or tonumber(s.created_ms) or 0
rcall('HSET', skey, 'cursor', cursor, 'next_ms', cursor)
rcall('HINCRBY', skey, 'version', 1)
rcall('SADD', tag .. 'schedules', sid)
local ukey = usage_key(tag, s.tenant)
usage_add(ukey, 'schedules', 1)
usage_add(ukey, 'bytes', #(s.payload or ''))
usage_add(ukey, 'q:' .. s.queue, 1)
if s.state ~= 'paused' then
  -- An ended schedule plans again from its cursor too: the planner ends it once more if
  -- nothing is left (end_at or max_runs).
  rcall('HSET', skey, 'state', 'active')
  schedule_index(tag, s.tenant, sid, cursor)
end
return { 1 }
