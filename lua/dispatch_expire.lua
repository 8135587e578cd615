--[[ dispatch_expire: delete finished records (succeeded, cancelled, dead) past retention.
  KEYS[1] meta    HASH tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] expiry  ZSET tag..'expiry', finish bucket_start -> bucket_start
  ARGV[1] retention_ms   ARGV[2] bucket_ms   ARGV[3] limit: most records deleted per call
          (<= 5000, to keep the call short)   ARGV[4] now_ms override ('' = TIME)
  Derived keys (same tag): x:<bucket>, t:<xy>.
  Returns: {deleted, more}   more = 1 if expired buckets may remain
  Meta fields xbucket/xcursor hold the HSCAN cursor of a bucket drained across calls.
  Records are kept so GET still answers and an idempotent create still finds its task
  (DESIGN.md section 3); a record that went back to scheduled meanwhile is left alone. ]]
local rcall = redis.call
local meta_key, expiry_key = KEYS[1], KEYS[2]
local retention_ms, bucket_ms, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now_override = ARGV[4]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua

local cutoff = clock_now_ms(now_override) - retention_ms - bucket_ms
local deleted = 0
while deleted < limit do
  local b = rcall('ZRANGE', expiry_key, '-inf', cutoff, 'BYSCORE', 'LIMIT', 0, 1)[1]
  if b == nil then
    return { deleted, 0 }
  end
  local xkey = tag .. 'x:' .. b
  local state = rcall('HMGET', meta_key, 'xbucket', 'xcursor')
  local cursor = '0'
  if state[1] == b and state[2] then
    cursor = state[2]
  end
  local scan = rcall('HSCAN', xkey, cursor, 'COUNT', limit - deleted)
  local fields = scan[2]
  local ids = {}
  for i = 1, #fields, 2 do
    local run_id = fields[i]
    ids[#ids + 1] = run_id
    local bkey = body_key(tag, run_id)
    local r = record_load(bkey, run_id)
    if r and r[R_STATE] ~= ST_SCHEDULED and r[R_STATE] ~= ST_DISPATCHED then
      record_delete(bkey, run_id)
    end
  end
  if #ids > 0 then
    rcall('HDEL', xkey, unpack(ids))
  end
  deleted = deleted + #ids
  if rcall('EXISTS', xkey) == 0 then
    rcall('ZREM', expiry_key, b)
    rcall('HDEL', meta_key, 'xbucket', 'xcursor')
  elseif scan[1] == '0' then
    rcall('HDEL', meta_key, 'xbucket', 'xcursor')
  else
    -- A large (hashtable) bucket is drained across calls from a saved cursor.
    rcall('HSET', meta_key, 'xbucket', b, 'xcursor', scan[1])
  end
end
return { deleted, 1 }
