--[[ dispatch_promote: move the far buckets that start within the horizon into the near level.
  KEYS[1] meta   HASH tag..'meta' (field promoted_until; the tag is KEYS[1] minus 'meta')
  KEYS[2] due    ZSET tag..'due'
  KEYS[3] wheel  ZSET tag..'wheel', bucket_start -> bucket_start
  ARGV[1] horizon_ms   ARGV[2] bucket_ms   ARGV[3] limit: most runs moved per call (<= 5000:
          HSCAN COUNT and HDEL arguments stay small and the call stays short)
  ARGV[4] now_ms override ('' = TIME)   ARGV[5] node ('' = unfenced)   ARGV[6] epoch
  Derived keys (same tag): w:<bucket> and its children w:<bucket>:<hex> (lib/wheel.lua),
  t:<xy>, near:<tenant>, lease.
  Returns: {moved, more, promoted_until, next_bucket_ms}   more = 1 if buckets within the
           horizon remain; next_bucket_ms = -1 when the far level is empty.
  Errors:  {-3} LEASE_LOST.
  A bucket is drained with HSCAN (wheel_drain, lib/wheel.lua), cursor kept in meta
  (pcursor, pbucket), so a bucket of a thundering herd (100k runs, hashtable-encoded)
  moves in bounded steps. promoted_until only advances once every bucket that starts
  before it is empty, which keeps the invariant create relies on: no far-level entry is
  due before promoted_until. ]]
local rcall = redis.call
local meta_key, due_key, wheel_key = KEYS[1], KEYS[2], KEYS[3]
local horizon_ms, bucket_ms, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now_override, node, epoch = ARGV[4], ARGV[5], ARGV[6]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/lease.lua

if not lease_holds(tag, node, epoch) then
  return { -3 }
end

local now = clock_shard_ms(meta_key, now_override)
local reach = now + horizon_ms
local shard_hex = wheel_run_id(tag, '')  -- bucket members lack it (lib/wheel.lua)

-- A far bucket's member goes to its tenant's near level (a stale one, no longer
-- scheduled, is only dropped).
local function promote(member)
  local run_id = shard_hex .. member
  local r = record_read(body_key(tag, run_id), run_id)
  if r and r[R_STATE] == ST_SCHEDULED then
    rcall('ZADD', tag .. 'near:' .. r[R_TENANT], r[R_DUE], run_id)
    rcall('ZADD', due_key, 'LT', r[R_DUE], r[R_TENANT])
  end
end

local moved, at_limit = wheel_drain(wheel_key, tag .. 'w:', reach, limit, promote, meta_key,
  'pbucket', 'pcursor')
local more = 0
if at_limit and wheel_first_bucket(wheel_key, reach) then
  more = 1  -- the limit stopped it with a bucket within the horizon left
end

local promoted_until = wheel_promoted_until(meta_key)
if more == 0 then
  local reach_end = reach - (reach % bucket_ms) + bucket_ms
  if reach_end > promoted_until then
    promoted_until = reach_end
    rcall('HSET', meta_key, 'promoted_until', promoted_until)
  end
end
local next_bucket = rcall('ZRANGE', wheel_key, 0, 0, 'WITHSCORES')[2]  -- a child's is its start
return { moved, more, promoted_until, tonumber(next_bucket) or -1 }
