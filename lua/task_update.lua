--[[ task_update: reschedule a scheduled run and/or replace its payload.
  KEYS[1] meta    HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] run_id   ARGV[2] tenant
  ARGV[3] run_at_ms ('' = keep)   ARGV[4] delay_ms ('' = keep; used when ARGV[3] is '')
  ARGV[5] payload JSON text ('' = keep)   ARGV[6] bucket_ms   ARGV[7] now_ms override
  ARGV[8] event log cap   ARGV[9] wake channel ('' = none)   ARGV[10] shard number
  Derived keys (same tag): the run's body hash (lib/bodies.lua), meta, near:<tenant>, due, w:<bucket>, wheel, use:<tenant> (a
  counted run's new payload replaces the old one in bytes; lib/usage.lua).
  Returns: {1, record, wake}   updated; wake = 1 if the shard's next action moved earlier
  Errors:  {-1} NOT_FOUND      no such run for this tenant
           {-2, state}         INVALID_STATE: not scheduled any more ]]
local meta_key, events_key = KEYS[1], KEYS[2]
local run_id, tenant, run_at, delay_ms = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local payload, bucket_ms, now_override = ARGV[5], tonumber(ARGV[6]), ARGV[7]
local event_cap, wake_channel, shard = ARGV[8], ARGV[9], ARGV[10]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/usage.lua
--!include lib/wake.lua
--!include lib/events.lua

local body_key_ = body_key(tag, run_id)
local r, refusal = record_scheduled(body_key_, run_id, tenant)
if refusal then
  return refusal
end
local now = clock_now_ms(now_override)
local wake = 0
local due_ms = r[R_DUE]
if run_at ~= '' then
  due_ms = tonumber(run_at)
elseif delay_ms ~= '' then
  due_ms = now + tonumber(delay_ms)
end
if due_ms ~= r[R_DUE] then
  wheel_remove(tag, run_id, tenant, r[R_DUE], bucket_ms, r[R_QUEUE])
  wake = wheel_place(tag, meta_key, run_id, tenant, due_ms, bucket_ms)
  r[R_DUE] = due_ms
end
if payload ~= '' then
  if usage_counted(r) then
    usage_add(usage_key(tag, tenant), 'bytes', #payload - #r[R_PAYLOAD])
  end
  r[R_PAYLOAD] = payload
end
r[R_UPDATED] = now
local raw = record_save(body_key_, run_id, r)
event_emit(events_key, event_cap, 'e', 'updated', 'id', run_id, 'tenant', tenant, 'at', now,
  'due_ms', due_ms)
wake_publish(wake, wake_channel, shard)
return { 1, raw, wake }
