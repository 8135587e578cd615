--[[ run_ack: an executor finished a run: acknowledge its stream entry, state -> succeeded.
  KEYS[1] stream  STREAM tag..'q:'..tenant..':'..queue (the tag is KEYS[1] up to '}:')
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] consumer group   ARGV[2] stream entry id   ARGV[3] run_id   ARGV[4] attempt
  ARGV[5] bucket_ms   ARGV[6] now_ms override ('' = TIME)   ARGV[7] event log cap
  ARGV[8] wake channel ('' = none)   ARGV[9] shard number (the wake message, sent when a
  run held back by overlap buffer_one is released and is the shard's next action)
  Derived keys (same tag): t:<xy>, meta and near:<tenant> (record_sent), x:<bucket>, expiry,
  use:<tenant> (a counted run stops counting: q:<queue>, bytes; lib/usage.lua),
  and for a schedule's run s:<sid>
  (no longer in flight) and the run it held back, put back in the wheel (meta, near, due).
  Returns: {1}   acknowledged and the run is now succeeded. This includes a late ack of
                 an attempt the reaper had already given up on, while its retry still
                 waits in the wheel: the work is done, so the retry is dropped.
           {0}   the entry was acknowledged, but the run had already moved on (a later
                 attempt is out, or the run is finished): nothing changed
  Errors:  {-1} NOT_FOUND: no record for this run id in this shard.
  The entry is deleted from the stream once acknowledged, so ready streams hold only
  unacknowledged work and never drop any of it. ]]
local stream_key, events_key = KEYS[1], KEYS[2]
local group, entry_id, run_id, attempt = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local bucket_ms, now_override, event_cap = tonumber(ARGV[5]), ARGV[6], ARGV[7]
local wake_channel, shard = ARGV[8], ARGV[9]
local tag = string.match(stream_key, '^(.-}:)')

--!include lib/record.lua
--!include lib/delivery.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/usage.lua
--!include lib/wake.lua
--!include lib/events.lua
--!include lib/schedule.lua

local r, bkey = delivery_report(tag, stream_key, group, entry_id, run_id)
if r == nil then
  return { -1 }
end
if r[R_ATTEMPT] ~= attempt or (r[R_STATE] ~= ST_DISPATCHED and r[R_STATE] ~= ST_SCHEDULED) then
  return { 0 }
end
local now = clock_now_ms(now_override)
if r[R_STATE] == ST_SCHEDULED then
  wheel_remove(tag, run_id, r[R_TENANT], r[R_DUE], bucket_ms)
end
r[R_STATE], r[R_UPDATED] = ST_SUCCEEDED, now
record_save(bkey, run_id, r)
wheel_retain(tag, run_id, now, bucket_ms)
if usage_counted(r) then
  usage_run(usage_key(tag, r[R_TENANT]), r, -1, -1)
end
wake_publish(schedule_run_finished(tag, r[R_SCHEDULE], run_id, now, bucket_ms), wake_channel,
  shard)
event_emit(events_key, event_cap, 'e', 'acked', 'id', run_id, 'tenant', r[R_TENANT],
  'attempt', attempt, 'at', now)
return { 1 }
