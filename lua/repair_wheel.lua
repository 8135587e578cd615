--[[ repair_wheel: put a scheduled run the audit found outside the wheel back into it, as
  create places it (timewheel audit --repair; docs/operations/auditing.md).
  KEYS[1] meta  HASH tag..'meta' (the tag is KEYS[1] minus 'meta')
  ARGV[1] run_id   ARGV[2] its attempt as the audit found it stored ('' = any)
  ARGV[3] bucket_ms   ARGV[4] now_ms override ('' = TIME)   ARGV[5] wake channel
  ('' = none)   ARGV[6] shard number (the wake message)
  Derived keys (same tag): the body hashes, near:<tenant>, due, w:<bucket> and its
  children, wheel, wd:<start> and its children, distant (lib/wheel.lua), s:<sid>, rates,
  tokens.
  Returns: {1}         placed (wheel_place: its level, the wheel index, the due index)
           {0, why}    nothing done: 'moved on' (no longer scheduled at that attempt),
                       'held' (its schedule holds it back), 'in place' (a parked run
                       included, lib/park.lua), or 'out' (due
                       before promoted_until and in no level: it was sent, and only its
                       ready stream can tell; repair_retry is for that)
  Errors:  none.
  Placed: a run due at or after promoted_until that is in no level, or whose far (or
  distant) bucket its index lacks; a run in the near level whose tenant is missing from the due
  index or, with no dispatch_rate, listed there later than the run. Nothing is deleted. ]]
local rcall = redis.call
local meta_key = KEYS[1]
local run_id, attempt, bucket_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now_override, wake_channel, shard = ARGV[4], ARGV[5], ARGV[6]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/wake.lua
--!include lib/rate.lua
--!include lib/audit.lua

local r = audit_read(tag, run_id)
if r == nil or r[R_STATE] ~= ST_SCHEDULED or (attempt and r[R_ATTEMPT] ~= attempt) then
  return { 0, 'moved on' }
end
local near, far, held = audit_where(tag, run_id, r, bucket_ms)
if held then
  return { 0, 'held' }
end
if rcall('ZSCORE', tag .. 'park:' .. r[R_TENANT] .. ':' .. r[R_QUEUE], run_id) then
  return { 0, 'in place' }  -- parked: its stream is over its backlog cap (lib/park.lua)
end
local tenant, due = r[R_TENANT], r[R_DUE]
local promoted = wheel_promoted_until(meta_key)
if near then
  local entry = tonumber(rcall('ZSCORE', tag .. 'due', tenant))
  if entry ~= nil then
    if entry <= tonumber(near) then
      return { 0, 'in place' }
    end
    local rate = rate_buckets(tag, { tenant }, clock_shard_ms(meta_key, now_override))
    if rate[tenant] then
      return { 0, 'in place' }  -- held back by its dispatch_rate on purpose
    end
  end
  -- Into the near level, where it is: the near entry stays, the due index learns it.
  promoted = math.max(promoted, due + 1)
elseif far then
  -- In its far bucket (or a child of it, or its distant bucket, lib/wheel.lua): only the
  -- index can be missing it.
  local start = audit_bucket(due, bucket_ms)
  local index = 'wheel'
  local name = wheel_far(tag, start, wheel_member(run_id))
  if name == nil then
    index, start = 'distant', wheel_distant_start(due, bucket_ms)
    name = wheel_distant(tag, start, wheel_member(run_id))
  end
  if rcall('ZSCORE', tag .. index, name) then
    return { 0, 'in place' }
  end
  local earliest = rcall('ZRANGE', tag .. 'wheel', 0, 0, 'WITHSCORES')[2]
  rcall('ZADD', tag .. index, start, name)
  local wake = 0
  if earliest == nil or tonumber(earliest) > tonumber(start) then
    wake = 1
  end
  wake_publish(wake, wake_channel, shard)
  return { 1 }
elseif due < promoted then
  return { 0, 'out' }
end
wake_publish(wheel_place(tag, meta_key, run_id, tenant, due, bucket_ms, promoted),
  wake_channel, shard)
return { 1 }
