--[[ task_cancel: cancel a run that is still scheduled.
  KEYS[1] meta    HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] run_id   ARGV[2] tenant   ARGV[3] bucket_ms   ARGV[4] now_ms override ('' = TIME)
  ARGV[5] event log cap
  Derived keys (same tag): the run's body hash (lib/bodies.lua), meta, near:<tenant>, w:<bucket>, wheel, x:<bucket>, expiry,
  use:<tenant> (a counted run stops counting: q:<queue>, bytes; lib/usage.lua).
  Returns: {1, record}         cancelled; the record after the change
  Errors:  {-1} NOT_FOUND      no such run for this tenant (another tenant's id included)
           {-2, state}         INVALID_STATE: not scheduled any more ]]
local meta_key, events_key = KEYS[1], KEYS[2]
local run_id, tenant, bucket_ms, now_override = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local event_cap = ARGV[5]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/usage.lua
--!include lib/events.lua

local body_key_ = body_key(tag, run_id)
local r, refusal = record_scheduled(body_key_, run_id, tenant)
if refusal then
  return refusal
end
local now = clock_now_ms(now_override)
wheel_remove(tag, run_id, tenant, r[R_DUE], bucket_ms, r[R_QUEUE])
r[R_STATE], r[R_UPDATED] = ST_CANCELLED, now
local raw = record_save(body_key_, run_id, r)
wheel_retain(tag, run_id, now, bucket_ms)
if usage_counted(r) then
  usage_run(usage_key(tag, tenant), r, -1, -1)
end
event_emit(events_key, event_cap, 'e', 'cancelled', 'id', run_id, 'tenant', tenant, 'at', now)
return { 1, raw }
