--[[ repair_retry: a run out (dispatched) whose ready-stream entry is gone goes through its
  retry policy, as the reaper sends a run whose executor lease expired (timewheel audit
  --repair; docs/operations/auditing.md).
  KEYS[1] meta    HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] run_id   ARGV[2] the attempt it is out with, as the audit found it
  ARGV[3] retry defaults JSON   ARGV[4] rand in [0, 1) for jitter   ARGV[5] bucket_ms
  ARGV[6] now_ms override ('' = TIME)   ARGV[7] event log cap   ARGV[8] wake channel
  ('' = none)   ARGV[9] shard number (the wake message)
  Derived keys (same tag): t:<xy>, near:<tenant>, due, w:<bucket>, wheel, s:<sid>,
  dead:<tenant>.
  Returns: {1, due_ms}     back in the wheel for its next attempt at due_ms
           {2, entry_id}   dead-lettered: its attempts are used up
           {0}             nothing done: the run is no longer out at that attempt, or it
                           is a scheduled run due at or after promoted_until
                           (repair_wheel is for that)
  Errors:  none.
  The lost attempt counts as failed (reason delivery_lost), through retry_or_bury
  (lib/retry.lua), which writes the retry_scheduled or dead event. Nothing is deleted. ]]
local meta_key, events_key = KEYS[1], KEYS[2]
local run_id, attempt, defaults_json = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local rand, bucket_ms, now_override = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local event_cap, wake_channel, shard = ARGV[7], ARGV[8], ARGV[9]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/retry.lua
--!include lib/audit.lua

local r = audit_read(tag, run_id)
local promoted = wheel_promoted_until(meta_key)
if r == nil or audit_sent_attempt(tag, run_id, r, promoted, bucket_ms) ~= attempt then
  return { 0 }
end
if r[R_STATE] == ST_SCHEDULED and r[R_DUE] >= promoted then
  return { 0 }
end
r[R_STATE], r[R_ATTEMPT] = ST_DISPATCHED, attempt
local outcome, detail = retry_or_bury(tag, body_key(tag, run_id), run_id, r, {
  now = clock_now_ms(now_override), defaults = cjson.decode(defaults_json),
  error = 'its ready-stream entry was lost (found by timewheel audit)',
  reason = 'delivery_lost', permanent = false, delay_ms = nil, rand = rand,
  bucket_ms = bucket_ms, events_key = events_key, event_cap = event_cap,
  wake_channel = wake_channel, shard = shard,
})
if outcome == 'retry' then
  return { 1, detail }
end
return { 2, detail }
