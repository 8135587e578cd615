--[[ dispatch_promote: move the far buckets that start within the horizon into the near level,
  and the distant buckets that start within one distant width of it into far buckets.
  KEYS[1] meta   HASH tag..'meta' (field promoted_until; the tag is KEYS[1] minus 'meta')
  KEYS[2] due    ZSET tag..'due'
  KEYS[3] wheel  ZSET tag..'wheel', bucket_start -> bucket_start
  ARGV[1] horizon_ms   ARGV[2] bucket_ms   ARGV[3] limit: most runs moved per call (<= 5000:
          HSCAN COUNT and HDEL arguments stay small and the call stays short)
  ARGV[4] now_ms override ('' = TIME)   ARGV[5] node ('' = unfenced)   ARGV[6] epoch
  Derived keys (same tag): w:<bucket> and its children w:<bucket>:<hex> (lib/wheel.lua),
  distant, wd:<start> and its children, the body hashes, near:<tenant>, lease.
  Returns: {moved, more, promoted_until, next_bucket_ms, cascaded}   more = 1 if buckets
           within the horizon (or distant ones within its reach) remain; next_bucket_ms:
           when the next bucket comes due for this call (a far bucket's start, a distant
           one's start less its width), -1 when both levels are empty; cascaded: runs moved
           from distant buckets into far ones.
  Errors:  {-3} LEASE_LOST.
  Distant buckets are drained first (cursor dcursor, dbucket), each run into its far
  bucket, which this call's promotion then takes if it is within the horizon.
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

-- A distant bucket's member goes to its far bucket (never back to a distant one).
local function cascade(member)
  local run_id = shard_hex .. member
  local r = record_read(body_key(tag, run_id), run_id)
  if r and r[R_STATE] == ST_SCHEDULED then
    wheel_place_far(tag, run_id, r[R_DUE], bucket_ms)
  end
end

local distant_key, width = tag .. 'distant', wheel_distant_width(bucket_ms)
local cascaded, at_limit = wheel_drain(distant_key, tag .. 'wd:', reach + width, limit, cascade,
  meta_key, 'dbucket', 'dcursor')
local moved = 0
local more = 0
if at_limit then
  more = 1  -- the limit stopped it with a distant bucket within reach left
else
  moved, at_limit = wheel_drain(wheel_key, tag .. 'w:', reach, limit - cascaded, promote,
    meta_key, 'pbucket', 'pcursor')
  if at_limit and wheel_first_bucket(wheel_key, reach) then
    more = 1  -- the limit stopped it with a bucket within the horizon left
  end
end

local promoted_until = wheel_promoted_until(meta_key)
if more == 0 then
  local reach_end = reach - (reach % bucket_ms) + bucket_ms
  if reach_end > promoted_until then
    promoted_until = reach_end
    rcall('HSET', meta_key, 'promoted_until', promoted_until)
  end
end
local next_bucket = tonumber(rcall('ZRANGE', wheel_key, 0, 0, 'WITHSCORES')[2])  -- a child's
-- is its start
local next_distant = tonumber(rcall('ZRANGE', distant_key, 0, 0, 'WITHSCORES')[2])
if next_distant and (next_bucket == nil or next_distant - width < next_bucket) then
  next_bucket = next_distant - width
end
return { moved, more, promoted_until, next_bucket or -1, cascaded }
