--[[ schedule_update: change a schedule; its future materialized runs are replaced at once.
  KEYS[1] meta      HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] schedule  HASH   tag..'s:'..sid
  KEYS[3] events    STREAM tag..'events'
  ARGV[1] sid   ARGV[2] tenant   ARGV[3] changed fields as a flat list in JSON text,
          e.g. ["payload","{}","spec","{...}"] (names of the schedule hash: queue payload
          opts spec catchup window_ms overlap max_runs)
  ARGV[4] cursor: fire times after it are planned   ARGV[5] fire times to materialize
  now, ascending, comma-separated   ARGV[6] the next fire time after them (-1 = none)
  ARGV[7] bucket_ms   ARGV[8] misfire_ms   ARGV[9] now_ms override   ARGV[10] event log cap
  ARGV[11] wake channel ('' = none)   ARGV[12] shard number   ARGV[13] the version the
  caller read (the fire times above were computed from that schedule)
  Derived keys (same tag): sr:<sid>, plan, t:<xy>, near:<tenant>, due, w:<bucket>, wheel.
  Returns: {1, added, wake}   updated; runs already dispatched are not touched
           {0}                the schedule changed since the caller read it: nothing done
  Errors:  {-1} NOT_FOUND     no such schedule for this tenant ]]
local rcall = redis.call
local meta_key, skey, events_key = KEYS[1], KEYS[2], KEYS[3]
local sid, tenant = ARGV[1], ARGV[2]
local tag = string.sub(meta_key, 1, -5)

--!include lib/hash.lua
--!include lib/clock.lua
--!include lib/wake.lua
--!include lib/events.lua
--!include lib/schedule.lua

local s = schedule_owned(skey, tenant)
if s == nil then
  return { -1 }
end
if s.version ~= ARGV[13] then
  return { 0 }
end
local now = clock_now_ms(ARGV[9])
local bucket_ms = tonumber(ARGV[7])
local changes = cjson.decode(ARGV[3])
hash_table(changes, s)
if #changes > 0 then
  rcall('HSET', skey, unpack(changes))
end
local _, dropped = schedule_drop_pending(tag, sid, bucket_ms)
s.planned = math.max(0, (tonumber(s.planned) or 0) - dropped)
s.cursor = ARGV[4]
rcall('HINCRBY', skey, 'version', 1)
rcall('HSET', skey, 'updated_ms', now, 'planned', s.planned, 'cursor', s.cursor)
local ctx = { tag = tag, now = now, bucket_ms = bucket_ms, misfire_ms = tonumber(ARGV[8]),
  events_key = events_key, event_cap = ARGV[10], wake = 0 }
local fires, after = schedule_fires(ARGV[5]), tonumber(ARGV[6])
local added = 0
if s.state == 'paused' then
  rcall('HSET', skey, 'next_ms', fires[1] or after)
else
  added = schedule_extend(ctx, sid, skey, s, fires, after)
end
event_emit(events_key, ctx.event_cap, 'e', 'schedule_updated', 'id', sid, 'tenant', tenant,
  'at', now)
wake_publish(ctx.wake, ARGV[11], ARGV[12])
return { 1, added, ctx.wake }
