--[[ schedule_materialize: the planner extends an active schedule's runs up to its horizon.
  KEYS[1] meta      HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] schedule  HASH   tag..'s:'..sid
  KEYS[3] events    STREAM tag..'events'
  ARGV[1] sid   ARGV[2] node ('' = unfenced)   ARGV[3] epoch
  ARGV[4] version the planner read   ARGV[5] cursor the planner read (the fire times
          below follow it)   ARGV[6] fire times, ascending, comma-separated
  ARGV[7] the next fire time after them (-1 = none: the schedule ends)
  ARGV[8] bucket_ms   ARGV[9] misfire_ms   ARGV[10] now_ms override ('' = TIME)
  ARGV[11] event log cap   ARGV[12] wake channel ('' = none)   ARGV[13] shard number
  ARGV[14] tenant whose plan index held the schedule
  Derived keys (same tag): sr:<sid>, plan_tenants, plan:<tenant>, lease, t:<xy>, near:<tenant>, due, w:<bucket>,
  wheel.
  Returns: {added, skipped, stale}   stale = 1: the schedule changed since the planner
           read it (updated, paused, deleted), so nothing was done
  Errors:  {-3} LEASE_LOST: ARGV[2] no longer holds the shard at epoch ARGV[3].
  A fire time already missed by more than misfire_ms (the planner was down) follows the
  schedule's catchup policy; skipped ones are recorded as 'skipped' events. ]]
local rcall = redis.call
local meta_key, skey, events_key = KEYS[1], KEYS[2], KEYS[3]
local sid, node, epoch = ARGV[1], ARGV[2], ARGV[3]
local read_version, read_cursor, fires_text, after = ARGV[4], ARGV[5], ARGV[6], tonumber(ARGV[7])
local bucket_ms, misfire_ms, now_override = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10]
local event_cap, wake_channel, shard, tenant = ARGV[11], ARGV[12], ARGV[13], ARGV[14]
local tag = string.sub(meta_key, 1, -5)

--!include lib/clock.lua
--!include lib/wake.lua
--!include lib/lease.lua
--!include lib/schedule.lua

if not lease_holds(tag, node, epoch) then
  return { -3 }
end
local s = schedule_load(skey)
if s == nil or s.state ~= 'active' or s.version ~= read_version or s.cursor ~= read_cursor then
  if s == nil then
    schedule_unindex(tag, tenant, sid)
  end
  return { 0, 0, 1 }
end
local ctx = schedule_ctx(tag, clock_now_ms(now_override), bucket_ms, misfire_ms, events_key,
  event_cap)
local added, skipped = schedule_extend(ctx, sid, skey, s, schedule_fires(fires_text), after)
wake_publish(ctx.wake, wake_channel, shard)
return { added, skipped, 0 }
