--[[ run_fail: an executor's attempt failed: acknowledge the entry, then retry later or bury.
  KEYS[1] stream  STREAM tag..'q:'..tenant..':'..queue (the tag is KEYS[1] up to '}:')
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] consumer group   ARGV[2] stream entry id   ARGV[3] run_id   ARGV[4] attempt
  ARGV[5] error text   ARGV[6] permanent ('1': dead-letter now, no retry)
  ARGV[7] delay_ms before the retry ('' = the retry policy's backoff; an executor's
          Retry-After, say)   ARGV[8] rand in [0, 1) for jitter
  ARGV[9] retry defaults JSON {max_attempts, initial_s, factor, max_s, jitter}
  ARGV[10] bucket_ms   ARGV[11] now_ms override ('' = TIME)   ARGV[12] event log cap
  ARGV[13] wake channel ('' = none)   ARGV[14] shard number (the wake message)
  Derived keys (same tag): t:<xy>, meta, near:<tenant>, due, w:<bucket>, wheel,
  dead:<tenant>.
  Returns: {1, due_ms}     back in the wheel for attempt + 1 at due_ms
           {2, entry_id}   dead-lettered (max_attempts reached, or permanent)
           {0}             the entry was acknowledged but the run had moved on (stale)
  Errors:  {-1} NOT_FOUND: no record for this run id in this shard. ]]
local stream_key, events_key = KEYS[1], KEYS[2]
local group, entry_id, run_id, attempt = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local err, permanent, delay_ms, rand = ARGV[5], ARGV[6] == '1', ARGV[7], tonumber(ARGV[8])
local defaults, bucket_ms = cjson.decode(ARGV[9]), tonumber(ARGV[10])
local now_override, event_cap, wake_channel, shard = ARGV[11], ARGV[12], ARGV[13], ARGV[14]
local tag = string.match(stream_key, '^(.-}:)')

--!include lib/delivery.lua
--!include lib/clock.lua
--!include lib/retry.lua

local r, bkey = delivery_report(tag, stream_key, group, entry_id, run_id)
if r == nil then
  return { -1 }
end
if not delivery_live(r, attempt) then
  return { 0 }
end
local outcome, detail = retry_or_bury(tag, bkey, run_id, r, {
  now = clock_now_ms(now_override), defaults = defaults, error = err, reason = 'failed',
  permanent = permanent, delay_ms = tonumber(delay_ms), rand = rand, bucket_ms = bucket_ms,
  events_key = events_key, event_cap = event_cap, wake_channel = wake_channel, shard = shard,
})
if outcome == 'retry' then
  return { 1, detail }
end
return { 2, detail }
