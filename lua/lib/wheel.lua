-- The hierarchical wheel of one shard (docs/design.md). Calls lib/bodies.lua.
--   near level:  tag..'near:'..tenant  ZSET run_id -> due_ms, for runs due before the
--                shard's promoted_until; tag..'due' ZSET tenant -> earliest near due_ms
--                (may be stale-early after a cancel; the tick repairs it).
--   far level:   tag..'w:'..bucket_start HASH member -> '' (listpack-sized), indexed by
--                tag..'wheel' ZSET bucket_start -> bucket_start. Bodies stay in the body
--                hash; the promoter reads due_ms and tenant from there. A bucket that
--                holds WHEEL_SPLIT members takes new ones in child buckets
--                tag..'w:'..bucket_start..':'..<hex digits>, indexed as bucket_start..':'..
--                <hex digits> -> bucket_start (wheel_path below).
--   distant buckets: a run due a distant bucket's width or more past promoted_until waits
--                in tag..'wd:'..start, a bucket WHEEL_DISTANT times as wide as a far one
--                and an hour at least (split as far buckets are), indexed by tag..'distant' ZSET start -> start; the promoter
--                moves a distant bucket's runs into far buckets (the cascade) once its
--                start is within one distant width of the horizon.
-- Invariant: no far-level entry has due_ms < meta.promoted_until, and no distant bucket
-- is due for its cascade without the promoter holding back promoted_until for it.
--
--   wheel_place(tag, meta, run_id, tenant, due_ms, bucket_ms, promoted_until, seen) -> wake
--       put a scheduled run in its level (promoted_until and seen optional: seen, a table
--       of the buckets a call that only adds put into, spares their HLEN and ZADD);
--       wheel_place_far(tag, run_id, due_ms, bucket_ms, seen) -> wake   into its far bucket
--       (the cascade: never back into a distant one); wheel_put(tag, index, prefix, bucket,
--       member, seen) -> name, new   a member into a bucket of either level, or its path's
--       child.
--   wheel_distant_width(bucket_ms) -> ms;  wheel_distant_start(due_ms, bucket_ms) -> text.
--   wheel_place_near(tag, tenant, placed, n, earliest) -> wake   many runs of one tenant,
--       each due before promoted_until, into the near level at once (placed[1..n]: {due_ms,
--       run_id, ...}, a due_ms as a number or its text; earliest: the least due_ms), as
--       wheel_place one by one would.
--   wheel_remove(tag, run_id, tenant, due_ms, bucket_ms, queue)   take it out again
--       (queue: also out of its pair's park set, lib/park.lua).
--   wheel_retain(tag, run_id, finished_ms, bucket_ms)   index a finished record for expiry;
--       wheel_retain_many(tag, run_ids, finished_ms, bucket_ms) many at once.
--   wheel_expire(tag, index_key, upto, limit, each, meta_key) -> taken, at_limit   the
--       finished runs of the expiry buckets (index_key: tag..'expiry') that start at or
--       before upto, handed to each(run_id) and taken out, at most `limit` per call.
--   wheel_promoted_until(meta) -> ms   where the near level ends.
--   wheel_member(run_id) -> member;  wheel_run_id(tag, member) -> run_id   far buckets'
--       members, without the shard characters.
--   wheel_path(bucket, member) -> names   the buckets (index members, level by level) a
--       far member of bucket start `bucket` may be in.
--   wheel_far(tag, bucket, member) -> name | nil   the bucket that holds it, if any;
--       wheel_find(tag, prefix, bucket, member, from) the same among keys
--       tag..prefix..name from level `from` of the path ('w:' far, 'wd:' distant);
--       wheel_distant(tag, start, member) -> name | nil   the same among distant buckets;
--       wheel_far_or_distant(tag, member, due_ms, bucket_ms) -> key | nil   the key of
--       whichever far or distant bucket holds it.
--   wheel_bucket_start(name) -> start   the start of a bucket named in the index.
--   wheel_first_bucket(index_key, upto) -> start | nil   the oldest bucket of an index.
--   wheel_drain(index_key, bucket_prefix, upto, limit, each, meta_key, bucket_field,
--       cursor_field) -> taken, at_limit   empty buckets of an index, in bounded steps;
--       wheel_drain_step(index_key, b, key, limit, each, meta_key, bucket_field,
--       cursor_field) -> taken   one step of one bucket.

-- A far bucket's member is the run id without its 3 shard characters: the key's tag
-- implies them (3 bytes of every far-level run).
local function wheel_member(run_id)
  return string.sub(run_id, 4)
end

-- The run id of a far bucket member of shard `tag` ('{<prefix>:<n>}:').
local function wheel_run_id(tag, member)
  return string.format('%03x', tonumber(string.match(tag, ':(%d+)}:$'))) .. member
end

-- Far buckets that split. A far bucket holds at most WHEEL_SPLIT members, so it stays a
-- listpack under hash-max-listpack-entries 1024 (deploy/redis.conf); once it holds that
-- many, a new member goes to a child chosen by the first hex digit of the member's SHA-1,
-- and past a full child to a grandchild by the first two, and so on: 'w:<start>',
-- 'w:<start>:a', 'w:<start>:a7', 'w:<start>:a7e' (the last level takes any number;
-- 1,000 + 16,000 + 256,000 before it, then 4,096 hashes). Each child is a member of the
-- wheel index scored by the bucket start, so the promoter drains it as any bucket. A
-- member is in one bucket of its path: placed only when the run is in no level, taken out
-- from the first bucket of the path that holds it. The digest is taken only past a full
-- bucket or on a miss in the bucket itself, so a bucket under the split costs what it did.
local WHEEL_SPLIT = 1000
local WHEEL_LEVELS = 4

local function wheel_path(bucket, member)
  local h = redis.sha1hex(member)
  local names = { bucket }
  for level = 1, WHEEL_LEVELS - 1 do
    names[level + 1] = bucket .. ':' .. string.sub(h, 1, level)
  end
  return names
end

-- The bucket of the path of `member` from `bucket` that holds it, among keys
-- tag..prefix..name ('w:' far buckets, 'wd:' distant ones), from level `from`, or nil.
local function wheel_find(tag, prefix, bucket, member, from)
  if from == 1 and redis.call('HEXISTS', tag .. prefix .. bucket, member) == 1 then
    return bucket
  end
  local names = wheel_path(bucket, member)
  for level = 2, WHEEL_LEVELS do
    if redis.call('HEXISTS', tag .. prefix .. names[level], member) == 1 then
      return names[level]
    end
  end
  return nil
end

local function wheel_far(tag, bucket, member)
  return wheel_find(tag, 'w:', bucket, member, 1)
end

-- Distant buckets: WHEEL_DISTANT (16) far buckets wide, an hour at least
-- (WHEEL_DISTANT_MIN_MS; in one function, the library's chunk holding 200 locals at most). A shard whose runs
-- spread thin over days (1,000 tenants over 7 days: 1.5 runs per 10-minute bucket) would
-- otherwise pay a key and an index entry for every run or two; a run due that far waits
-- in a bucket 16 times as wide, and moves into its far bucket once (the cascade) about
-- one distant width before the far bucket is promoted.
local function wheel_distant_width(bucket_ms)
  return math.max(bucket_ms * 16, 3600000)  -- WHEEL_DISTANT, WHEEL_DISTANT_MIN_MS
end

local function wheel_distant_start(due_ms, bucket_ms)
  local width = wheel_distant_width(bucket_ms)
  return string.format('%d', due_ms - (due_ms % width))
end

local function wheel_distant(tag, start, member)
  return wheel_find(tag, 'wd:', start, member, 1)
end

local function wheel_far_or_distant(tag, member, due_ms, bucket_ms)
  local bucket = string.format('%d', due_ms - (due_ms % bucket_ms))
  local name = wheel_far(tag, bucket, member)
  if name then
    return tag .. 'w:' .. name
  end
  name = wheel_distant(tag, wheel_distant_start(due_ms, bucket_ms), member)
  if name then
    return tag .. 'wd:' .. name
  end
  return nil
end

local function wheel_bucket_start(name)
  local colon = string.find(name, ':', 1, true)
  if colon then
    return string.sub(name, 1, colon - 1)
  end
  return name
end

local function wheel_promoted_until(meta)
  return tonumber(redis.call('HGET', meta, 'promoted_until')) or 0
end

-- A member into bucket `bucket` of index tag..index (keys tag..prefix..name), or the
-- first child of its path with room once the bucket is full. Returns the name it went
-- to and whether the index took a new entry for it. `seen` (optional), a table a call
-- that only adds (task_create) keeps for its placements: the members each bucket it put
-- into holds, so the next run into the same bucket costs an HSET alone (no HLEN, and no
-- ZADD: the bucket is indexed already).
local function wheel_put(tag, index, prefix, bucket, member, seen)
  local name, key = bucket, tag .. prefix .. bucket
  local held = seen and seen[key]
  if held ~= nil and held < WHEEL_SPLIT then
    seen[key] = held + redis.call('HSET', key, member, '')
    return name, false
  end
  held = held or redis.call('HLEN', key)
  if held >= WHEEL_SPLIT then
    local names = wheel_path(bucket, member)
    for level = 2, WHEEL_LEVELS do
      name, key = names[level], tag .. prefix .. names[level]
      if level == WHEEL_LEVELS or redis.call('HLEN', key) < WHEEL_SPLIT then
        break
      end
    end
    redis.call('HSET', key, member, '')
  else
    local added = redis.call('HSET', key, member, '')
    if seen then
      seen[key] = held + added
    end
  end
  return name, redis.call('ZADD', tag .. index, bucket, name) == 1
end

local function wheel_place_far(tag, run_id, due_ms, bucket_ms, seen)
  -- One integer format instead of three '%.14g' ones when Redis converts the number.
  local bucket = string.format('%d', due_ms - (due_ms % bucket_ms))
  local name, new = wheel_put(tag, 'wheel', 'w:', bucket, wheel_member(run_id), seen)
  if not new or name ~= bucket then
    return 0  -- the bucket was there already (a child's parent is), so not a new earliest
  end
  if redis.call('ZRANGE', tag .. 'wheel', 0, 0)[1] == bucket then
    return 1
  end
  return 0
end

-- Put a scheduled run into the level its due time belongs to. `promoted_until` may be
-- passed by a caller that places many runs in one call (it does not change within one).
-- Returns 1 if it became the earliest thing the scheduler has to act on for this shard
-- (so a sleeping scheduler should be woken), else 0.
local function wheel_place(tag, meta, run_id, tenant, due_ms, bucket_ms, promoted_until, seen)
  promoted_until = promoted_until or wheel_promoted_until(meta)
  if due_ms < promoted_until then
    local due_key = tag .. 'due'
    redis.call('ZADD', tag .. 'near:' .. tenant, due_ms, run_id)
    -- CH counts a new tenant or an earlier earliest: only then can this run be the
    -- shard's earliest, so the common case skips the lookup below.
    if redis.call('ZADD', due_key, 'LT', 'CH', due_ms, tenant) == 0 then
      return 0
    end
    local first = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
    if first[1] == tenant and tonumber(first[2]) == due_ms then
      return 1
    end
    return 0
  end
  local width = wheel_distant_width(bucket_ms)
  local start = due_ms - (due_ms % width)
  -- (not while an older release, which knows no distant bucket, may run: lib/bodies.lua)
  if start >= promoted_until + width and body_layout(tag).grow then
    -- Past the cascade's reach: a distant bucket, which only the promoter reads (and the
    -- scheduler visits the shard at least once per far bucket, so no wake).
    wheel_put(tag, 'distant', 'wd:', string.format('%d', start), wheel_member(run_id), seen)
    return 0
  end
  return wheel_place_far(tag, run_id, due_ms, bucket_ms, seen)
end

-- The runs of one tenant that a call (run_fail) puts back in the near level: one ZADD for
-- them all, and the due index moved to the earliest of them (the only one that can wake).
local function wheel_place_near(tag, tenant, placed, n, earliest)
  redis.call('ZADD', tag .. 'near:' .. tenant, unpack(placed, 1, n))
  local due_key = tag .. 'due'
  if redis.call('ZADD', due_key, 'LT', 'CH', earliest, tenant) == 0 then
    return 0
  end
  local first = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  if first[1] == tenant and tonumber(first[2]) == earliest then
    return 1
  end
  return 0
end

-- Take a scheduled run out of whichever level holds it.
local function wheel_remove(tag, run_id, tenant, due_ms, bucket_ms, queue)
  if redis.call('ZREM', tag .. 'near:' .. tenant, run_id) == 1 then
    return
  end
  if queue and redis.call('ZREM', tag .. 'park:' .. tenant .. ':' .. queue, run_id) == 1 then
    return  -- parked (lib/park.lua); the tick drops the pair once its set is empty
  end
  local bucket = string.format('%d', due_ms - (due_ms % bucket_ms))
  local member = wheel_member(run_id)
  local prefix, index = 'w:', 'wheel'
  local wkey = tag .. 'w:' .. bucket
  local name = bucket
  if redis.call('HDEL', wkey, member) == 0 then
    name = wheel_find(tag, 'w:', bucket, member, 2)  -- a child of the far bucket
    if name == nil then
      prefix, index = 'wd:', 'distant'
      name = wheel_distant(tag, wheel_distant_start(due_ms, bucket_ms), member)
      if name == nil then
        return
      end
    end
    wkey = tag .. prefix .. name
    redis.call('HDEL', wkey, member)
  end
  if redis.call('EXISTS', wkey) == 0 then
    redis.call('ZREM', tag .. index, name)
  end
end

-- Finished records (succeeded, cancelled, dead) are kept for the retention window so
-- GET and idempotent creates still find them; they are indexed by finish bucket in
-- tag..'xl:'..bucket LIST of run ids and tag..'expiry' ZSET, purged by dispatch_expire.lua.
-- A list takes a batch's ids in one RPUSH at O(1) each and stays compact however many
-- runs finish in a bucket. (A hash checks every new field against those it holds: a
-- listpack one, up to hash-max-listpack-entries, by a scan, which made the index a fifth
-- of an ack.) A run finished twice in a bucket is listed twice; expiry takes it once.
-- Buckets of earlier versions, tag..'x:'..bucket HASH run_id -> '', are drained as before.
local function wheel_retain_many(tag, run_ids, finished_ms, bucket_ms)
  if #run_ids == 0 then
    return
  end
  local bucket = finished_ms - (finished_ms % bucket_ms)
  -- One integer format, not Redis' '%.17g' of a number argument, twice.
  local b = string.format('%d', bucket)
  -- A list that is there is indexed already (wheel_expire drops both together).
  if redis.call('RPUSH', tag .. 'xl:' .. b, unpack(run_ids)) == #run_ids then
    redis.call('ZADD', tag .. 'expiry', b, b)
  end
end

local function wheel_retain(tag, run_id, finished_ms, bucket_ms)
  wheel_retain_many(tag, { run_id }, finished_ms, bucket_ms)
end

-- The oldest bucket of an index (tag..'wheel', tag..'expiry') that starts at or before
-- upto, or nil.
local function wheel_first_bucket(index_key, upto)
  return redis.call('ZRANGE', index_key, '-inf', upto, 'BYSCORE', 'LIMIT', 0, 1)[1]
end

-- One step of draining bucket b of an index (key its hash): at most `limit` members,
-- each handed to each(member) and deleted, read with HSCAN from a cursor kept in
-- meta_key (fields bucket_field, cursor_field), so a large (hashtable) bucket, such as a
-- thundering herd's, is drained across calls in bounded steps. Returns the members
-- taken; a bucket left empty leaves the index.
local function wheel_drain_step(index_key, b, key, limit, each, meta_key, bucket_field,
    cursor_field)
  local state = redis.call('HMGET', meta_key, bucket_field, cursor_field)
  local cursor = '0'
  if state[1] == b and state[2] then
    cursor = state[2]
  end
  local scan = redis.call('HSCAN', key, cursor, 'COUNT', limit)
  local fields = scan[2]
  local members = {}
  for i = 1, #fields, 2 do
    members[#members + 1] = fields[i]
    each(fields[i])
  end
  if #members > 0 then
    redis.call('HDEL', key, unpack(members))
  end
  if redis.call('EXISTS', key) == 0 then
    redis.call('ZREM', index_key, b)
    redis.call('HDEL', meta_key, bucket_field, cursor_field)
  elseif scan[1] == '0' then
    -- A full pass is done but members added meanwhile remain: start a new pass.
    redis.call('HDEL', meta_key, bucket_field, cursor_field)
  else
    redis.call('HSET', meta_key, bucket_field, b, cursor_field, scan[1])
  end
  return #members
end

-- Empty the buckets of an index that start at or before upto, oldest first (each a hash
-- bucket_prefix..start, wheel_drain_step). At most `limit` members per call. Returns
-- members taken, and whether it stopped at the limit (true: buckets may remain) rather
-- than for want of one (false).
local function wheel_drain(index_key, bucket_prefix, upto, limit, each, meta_key, bucket_field,
    cursor_field)
  local taken = 0
  while taken < limit do
    local b = wheel_first_bucket(index_key, upto)
    if b == nil then
      return taken, false
    end
    taken = taken + wheel_drain_step(index_key, b, bucket_prefix .. b, limit - taken, each,
      meta_key, bucket_field, cursor_field)
  end
  return taken, true
end

-- Empty the expiry buckets that start at or before upto, oldest first: a bucket's list
-- (LPOP, many at once), then the hash an earlier version may have left under the same
-- start (HSCAN steps, cursor in meta_key's xbucket and xcursor); the bucket leaves the
-- index once both are gone.
local function wheel_expire(tag, index_key, upto, limit, each, meta_key)
  local taken = 0
  while taken < limit do
    local b = wheel_first_bucket(index_key, upto)
    if b == nil then
      return taken, false
    end
    local ids = redis.call('LPOP', tag .. 'xl:' .. b, limit - taken)
    if ids then
      for i = 1, #ids do
        each(ids[i])
      end
      taken = taken + #ids
    elseif redis.call('EXISTS', tag .. 'x:' .. b) == 1 then
      taken = taken + wheel_drain_step(index_key, b, tag .. 'x:' .. b, limit - taken, each,
        meta_key, 'xbucket', 'xcursor')
    else
      redis.call('ZREM', index_key, b)
    end
  end
  return taken, true
end
