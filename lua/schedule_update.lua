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
  Derived keys (same tag): sr:<sid>, plan_tenants, plan:<tenant>, t:<xy>, near:<tenant>, due, w:<bucket>, wheel,
  use:<tenant> (a new queue or payload replaces the old one in q:<queue> and bytes;
  lib/usage.lua).
  Returns: {1, added, wake}   updated; runs already dispatched are not touched
           {0}                the schedule changed since the caller read it: nothing done
  Errors:  {-1} NOT_FOUND     no such schedule for this tenant ]]
local rcall = redis.call
local meta_key, skey, events_key = KEYS[1], KEYS[2], KEYS[3]
local sid, tenant, changes_json, cursor = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local fires_text, after, bucket_ms = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local misfire_ms, now_override, event_cap = tonumber(ARGV[8]), ARGV[9], ARGV[10]
local wake_channel, shard, read_version = ARGV[11], ARGV[12], ARGV[13]
local tag = string.sub(meta_key, 1, -5)

--!include lib/hash.lua
--!include lib/clock.lua
--!include lib/usage.lua
--!include lib/wake.lua
--!include lib/events.lua
--!include lib/schedule.lua

local s = schedule_owned(skey, tenant)
if s == nil then
  return { -1 }
end
if s.version ~= read_version then
  return { 0 }
end
local now = clock_now_ms(now_override)
local changes = cjson.decode(changes_json)
local old_queue, old_bytes = s.queue, #s.payload
hash_table(changes, s)
local ukey = usage_key(tag, tenant)
usage_add(ukey, 'bytes', #s.payload - old_bytes)
if s.queue ~= old_queue then
  usage_add(ukey, 'q:' .. s.queue, 1)
  usage_add(ukey, 'q:' .. old_queue, -1)
end
if #changes > 0 then
  rcall('HSET', skey, unpack(changes))
end
local _, dropped = schedule_drop_pending(tag, sid, bucket_ms)
s.planned = math.max(0, (tonumber(s.planned) or 0) - dropped)
s.cursor = cursor
rcall('HINCRBY', skey, 'version', 1)
rcall('HSET', skey, 'updated_ms', now, 'planned', s.planned, 'cursor', s.cursor)
local ctx = schedule_ctx(tag, now, bucket_ms, misfire_ms, events_key, event_cap)
local fires = schedule_fires(fires_text)
local added = 0
if s.state == 'paused' then
  rcall('HSET', skey, 'next_ms', fires[1] or after)
else
  added = schedule_extend(ctx, sid, skey, s, fires, after)
end
event_emit(events_key, event_cap, 'e', 'schedule_updated', 'id', sid, 'tenant', tenant,
  'at', now)
wake_publish(ctx.wake, wake_channel, shard)
return { 1, added, ctx.wake }
