--[[ restore_finished: write finished runs back into a shard rebuilt from PostgreSQL
  (timewheel restore): succeeded and cancelled records kept for the retention window,
  and dead-lettered runs with their dead letters.
  KEYS[1] meta    HASH   tag..'meta' (the shard tag is KEYS[1] minus 'meta')
  ARGV[1] bucket_ms   ARGV[2] n: runs in this call (<= 200, as restore_runs.lua)
  ARGV[3 ..] n groups of 13 values, one per run:
          run_id, state ('succeeded', 'cancelled' or 'dead'), attempt, due_ms, tenant,
          queue, created_ms, payload (JSON text), opts (JSON text, '' = none),
          finished_ms (when it finished or was buried), last_error ('' = none),
          schedule_id ('' = none), reason (of a dead letter: failed, lease_expired, ...)
  Derived keys (same tag): t:<xy>, x:<bucket>, expiry (succeeded, cancelled: indexed for
  expiry as when they finished, so dispatch_expire.lua deletes them when their retention
  ends), dead:<tenant> (a dead letter per dead run), use:<tenant> (a dead letter's payload
  counts in bytes, as lib/retry.lua counts it when it buries a run; lib/usage.lua).
  Returns: {written, existing}   existing = runs whose record was already there (left as
           they are: only a forced restore into a non-empty Redis meets them)
  Errors:  none expected; malformed input is an error reply.
  A finished record is what makes an idempotency key of a finished task still find its
  task (task_create.lua), and GET answer. No event is emitted: PostgreSQL already holds
  the history of these runs. ]]
local meta_key = KEYS[1]
local bucket_ms, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local tag = string.sub(meta_key, 1, -5)
local GROUP = 13

--!include lib/bodies.lua
--!include lib/record.lua
--!include lib/usage.lua
--!include lib/wheel.lua

local STATES = { succeeded = ST_SUCCEEDED, cancelled = ST_CANCELLED, dead = ST_DEAD }

local function opt(value)
  if value == '' then
    return nil
  end
  return value
end

if n > 200 or #ARGV ~= 2 + n * GROUP then
  return redis.error_reply('ERR timewheel: restore_finished takes n <= 200 groups of 13 values')
end
local written, existing = 0, 0
for i = 0, n - 1 do
  local a = 3 + i * GROUP
  local run_id, state, attempt, due_ms, tenant, queue, created_ms, payload, opts, finished_ms,
    last_error, sid, reason = unpack(ARGV, a, a + GROUP - 1)
  local st = STATES[state]
  if st == nil then
    return redis.error_reply('ERR timewheel: restore_finished: unknown state ' .. state)
  end
  finished_ms = tonumber(finished_ms)
  local r = { st, tonumber(attempt), tonumber(due_ms), tenant, queue, tonumber(created_ms),
    payload, opt(opts), finished_ms, opt(last_error), opt(sid), nil }
  local bkey = body_key(tag, run_id)
  if redis.call('HEXISTS', bkey, body_field(run_id)) == 1 then
    existing = existing + 1
  else
    if st == ST_DEAD then
      r[R_DEAD] = redis.call('XADD', tag .. 'dead:' .. tenant, '*', 'run_id', run_id,
        'tenant', tenant, 'queue', queue, 'attempt', r[R_ATTEMPT], 'reason', reason,
        'error', last_error, 'dead_ms', finished_ms, 'due_ms', r[R_DUE], 'payload', payload)
      usage_add(usage_key(tag, tenant), 'bytes', #payload)
    else
      wheel_retain(tag, run_id, finished_ms, bucket_ms)
    end
    record_create(tag, run_id, record_pack(r))
    written = written + 1
  end
end
return { written, existing }
