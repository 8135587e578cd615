--[[ create: schedule a new one-shot run in one shard.
  KEYS[1] meta    HASH  tag..'meta' (the shard tag is KEYS[1] minus 'meta')
  KEYS[2] body    HASH  tag..'t:'..xy, the body hash of ARGV[1]
  KEYS[3] events  STREAM tag..'events'
  ARGV[1] run_id (= task id)        ARGV[2] tenant        ARGV[3] queue
  ARGV[4] run_at_ms ('' = use delay) ARGV[5] delay_ms     ARGV[6] payload (JSON text)
  ARGV[7] opts (JSON text of non-default policy fields, '' = none)
  ARGV[8] idempotent ('1': the id was derived from an idempotency key)
  ARGV[9] bucket_ms   ARGV[10] now_ms override ('' = TIME)   ARGV[11] event log cap
  ARGV[12] wake channel ('' = none)   ARGV[13] shard number (the wake message)
  Derived keys (same tag): near:<tenant>, due, w:<bucket>, wheel.
  Returns: {1, due_ms, wake, now_ms}  created; wake = 1 if it moved the shard's next action
                                earlier; now_ms = the record's created time
           {0, record}          an idempotent duplicate: the existing record, unchanged
  Errors:  -1 NOT_FOUND is never returned here; a random-id collision is an error reply. ]]
local rcall = redis.call
local meta_key, body_key_, events_key = KEYS[1], KEYS[2], KEYS[3]
local run_id, tenant, queue = ARGV[1], ARGV[2], ARGV[3]
local run_at, delay_ms, payload, opts = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local idempotent, bucket_ms, now_override = ARGV[8] == '1', tonumber(ARGV[9]), ARGV[10]
local event_cap, wake_channel, shard = ARGV[11], ARGV[12], ARGV[13]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/events.lua

local now = clock_now_ms(now_override)
local due_ms
if run_at ~= '' then
  due_ms = tonumber(run_at)
else
  due_ms = now + tonumber(delay_ms)
end
if opts == '' then
  opts = nil
end

-- HSETNX is the existence check and the write in one call (the common case).
local record = record_pack({ ST_SCHEDULED, 0, due_ms, tenant, queue, now, payload, opts,
  nil, nil, nil, nil })
if record_create(body_key_, run_id, record) == 0 then
  local existing, raw = record_load(body_key_, run_id)
  if idempotent and existing[R_TENANT] == tenant then
    return { 0, raw }
  end
  return redis.error_reply('ERR timewheel: run id collision ' .. run_id)
end
local wake = wheel_place(tag, meta_key, run_id, tenant, due_ms, bucket_ms)
-- No payload in the event: the log stays small (it is capped by entries, not bytes), and
-- whoever needs the payload of a pending run reads it from the record.
event_emit(events_key, event_cap, 'e', 'created', 'id', run_id, 'tenant', tenant,
  'queue', queue, 'due_ms', due_ms, 'at', now)
if wake == 1 and wake_channel ~= '' then
  rcall('PUBLISH', wake_channel, shard)
end
return { 1, due_ms, wake, now }
