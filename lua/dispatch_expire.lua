--[[ dispatch_expire: delete finished records (succeeded, cancelled, dead) past retention.
  KEYS[1] meta    HASH tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] expiry  ZSET tag..'expiry', finish bucket_start -> bucket_start
  ARGV[1] retention_ms   ARGV[2] bucket_ms   ARGV[3] limit: most records deleted per call
          (<= 5000, to keep the call short)   ARGV[4] now_ms override ('' = TIME)
  Derived keys (same tag): xl:<bucket> (LIST of the bucket's finished runs), x:<bucket>
  (the HASH an earlier version kept instead), t:<xy>.
  Returns: {deleted, more}   more = 1 if expired buckets may remain
  Meta fields xbucket/xcursor hold the HSCAN cursor of an x: hash drained across calls.
  Records are kept so GET still answers and an idempotent create still finds its task
  (docs/design.md); a record that went back to scheduled meanwhile is left alone. ]]
local meta_key, expiry_key = KEYS[1], KEYS[2]
local retention_ms, bucket_ms, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now_override = ARGV[4]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua

-- An expiry bucket's member is a finished run: its record goes (a run that went back to
-- scheduled, or out again, since it finished keeps it).
local function expire(run_id)
  local r, bkey = record_find(tag, run_id)
  if r and r[R_STATE] ~= ST_SCHEDULED and r[R_STATE] ~= ST_DISPATCHED then
    record_delete(bkey, run_id)
  end
end

local cutoff = clock_now_ms(now_override) - retention_ms - bucket_ms
local deleted, at_limit = wheel_expire(tag, expiry_key, cutoff, limit, expire, meta_key)
return { deleted, at_limit and 1 or 0 }
