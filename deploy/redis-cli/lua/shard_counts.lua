-- What waits in one shard. KEYS[1] the shard's meta; ARGV[1] bucket_ms.
-- Answers: 'shard pending near far due unacked next_due owner'
--   pending   scheduled runs in the wheel (near + far)
--   near/far  runs in the near level / in far (and distant) buckets
--   due       runs due by the shard's clock, in either level (a due run in a far bucket
--             waits for the promoter); a far bucket of more than 1,024 runs that has
--             started counts whole
--   unacked   entries of the ready streams that have a consumer group (the groups set):
--             runs dispatched and not yet acknowledged
--   next_due  the earliest due time of a scheduled run (a far bucket of more than 1,024
--             runs counts as due at its start)
--   owner     the scheduler node holding the shard's lease
local tag = tw_tag(KEYS[1])
local bucket_ms = tonumber(ARGV[1])
local now = tw_now(tag)

local near, due, next_due = 0, 0, nil
for _, tenant in ipairs(redis.call('ZRANGE', tag .. 'due', 0, -1)) do
  local key = tag .. 'near:' .. tenant
  near = near + redis.call('ZCARD', key)
  due = due + redis.call('ZCOUNT', key, '-inf', now)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] and (next_due == nil or tonumber(first[2]) < next_due) then
    next_due = tonumber(first[2])
  end
end

local far = 0
-- Index members are bucket starts, or a full bucket's children '<start>:<hex>' scored by
-- their start (lua/lib/wheel.lua).
local wheel = redis.call('ZRANGE', tag .. 'wheel', 0, -1, 'WITHSCORES')
for j = 1, #wheel, 2 do
  local i, start = (j + 1) / 2, wheel[j]
  local runs = redis.call('HLEN', tag .. 'w:' .. start)
  far = far + runs
  local b = tonumber(wheel[j + 1])
  local straddles = b <= now and now < b + bucket_ms
  local first = i == 1 and next_due == nil
  local b_due, b_earliest = runs, b
  if straddles or first then
    b_due, b_earliest = tw_bucket_due(tag, start, now, 1024)
    if b_due == nil then
      b_due, b_earliest = runs, b
    end
  end
  if b + bucket_ms <= now then
    due = due + runs
  elseif straddles then
    due = due + b_due
  end
  if first then
    next_due = b_earliest
  end
end

-- Distant buckets (lua/lib/wheel.lua): hours away, counted in far; with nothing nearer,
-- the next due time is the first one's start.
local distant = redis.call('ZRANGE', tag .. 'distant', 0, -1, 'WITHSCORES')
for j = 1, #distant, 2 do
  far = far + redis.call('HLEN', tag .. 'wd:' .. distant[j])
end
if next_due == nil and distant[2] then
  next_due = tonumber(distant[2])
end

local streams, unacked = {}, 0
for _, entry in ipairs(redis.call('SMEMBERS', tag .. 'groups')) do
  local stream = string.match(entry, '|(.*)$')
  if stream and not streams[stream] then
    streams[stream] = true
    unacked = unacked + redis.call('XLEN', stream)
  end
end

local lease = redis.call('GET', tag .. 'lease')
local owner = lease and string.match(lease, '^(.*)/%d+$') or nil

return { 'ok', tw_line(tw_int(tw_shard(tag)), tw_int(near + far), tw_int(near), tw_int(far),
  tw_int(due), tw_int(unacked), tw_iso(next_due), tw_text(owner)) }
