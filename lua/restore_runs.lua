--[[ restore_runs: write runs back into a shard rebuilt from PostgreSQL (timewheel restore).
  KEYS[1] meta    HASH   tag..'meta' (the shard tag is KEYS[1] minus 'meta')
  ARGV[1] bucket_ms   ARGV[2] n: runs in this call (<= 200, so ARGV stays near 2,200
          values and one call blocks Redis well under a millisecond)
  ARGV[3 ..] n groups of 11 values, one per run:
          run_id, attempt, due_ms, tenant, queue, created_ms, payload (JSON text),
          opts (JSON text, '' = none), updated_ms ('' = none), last_error ('' = none),
          schedule_id ('' = none)
  Derived keys (same tag): t:<xy>, near:<tenant>, due, w:<bucket>, wheel, sr:<schedule id>,
  use:<tenant> (a counted run counts as create counts it: q:<queue>, bytes;
  lib/usage.lua).
  Returns: {written, existing}   existing = runs whose record was already there (left as
           they are: only a forced restore into a non-empty Redis meets them)
  Errors:  none expected; malformed input is an error reply.
  Every run is written in state scheduled with its attempt kept and placed by wheel_place,
  like create: a run that was dispatched and not acknowledged when Redis was lost is
  dispatched again (attempt + 1) under the same run id, and executors deduplicate by it.
  No event is emitted: PostgreSQL already holds the history of these runs. ]]
local meta_key = KEYS[1]
local bucket_ms, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local tag = string.sub(meta_key, 1, -5)
local GROUP = 11

--!include lib/record.lua
--!include lib/usage.lua
--!include lib/wheel.lua

local function opt(value)
  if value == '' then
    return nil
  end
  return value
end

if n > 200 or #ARGV ~= 2 + n * GROUP then
  return redis.error_reply('ERR timewheel: restore takes n <= 200 groups of 11 values')
end
local written, existing, tally = 0, 0, {}
for i = 0, n - 1 do
  local a = 3 + i * GROUP
  local run_id, attempt, due_ms, tenant, queue, created_ms, payload, opts, updated_ms,
    last_error, sid = unpack(ARGV, a, a + GROUP - 1)
  due_ms = tonumber(due_ms)
  local updated = opt(updated_ms)
  local r = { ST_SCHEDULED, tonumber(attempt), due_ms, tenant, queue, tonumber(created_ms),
    payload, opt(opts), updated and tonumber(updated), opt(last_error), opt(sid), nil }
  if record_create(tag, run_id, record_pack(r)) == 1 then
    wheel_place(tag, meta_key, run_id, tenant, due_ms, bucket_ms)
    if usage_counted(r) then
      usage_tally(tally, tenant, queue, #payload)
    end
    if sid ~= '' then
      -- A schedule's run: in its run index, so pause, update and delete find it.
      redis.call('ZADD', tag .. 'sr:' .. sid, due_ms, run_id)
    end
    written = written + 1
  else
    existing = existing + 1
  end
end
usage_flush(tag, tally)
return { written, existing }
