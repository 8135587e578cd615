--[[ run_ack: executors finished runs of one shard: acknowledge their stream entries, each
  run -> succeeded. One call takes one run or many (a worker's batch of acks).
  KEYS[1] events  STREAM tag..'events' (the tag is KEYS[1] minus 'events')
  KEYS[2..] the ready streams (tag..'q:'..tenant..':'..queue) the runs were delivered on
  ARGV[1] consumer group   ARGV[2] bucket_ms   ARGV[3] now_ms override ('' = TIME)
  ARGV[4] event log cap   ARGV[5] wake channel ('' = none)   ARGV[6] shard number (the wake
  message, sent when a run held back by overlap buffer_one is released and is the shard's
  next action)
  ARGV[7..] four per run: stream (its index among KEYS[2..]: 1 = KEYS[2]), stream entry
  id, run_id, attempt
  Derived keys (same tag): t:<xy>, meta and near:<tenant> (record_sent; one ZMSCORE per
  tenant), parked and park:<tenant>:<queue> (only while the shard has parked runs),
  xl:<bucket>, expiry,
  use:<tenant> (a counted run stops counting: q:<queue>, bytes; lib/usage.lua),
  and for a schedule's run s:<sid>
  (no longer in flight) and the run it held back, put back in the wheel (meta, near, due).
  Returns: one code per run, in ARGV's order:
           1   acknowledged and the run is now succeeded. This includes a late ack of
               an attempt the reaper had already given up on, while its retry still
               waits in the wheel: the work is done, so the retry is dropped.
           0   the entry was acknowledged, but the run had already moved on (a later
               attempt is out, or the run is finished; or the same run earlier in this
               call): nothing changed
           -1  NOT_FOUND: no record for this run id in this shard.
  Every entry is deleted from its stream once acknowledged (one XACK and one XDEL per
  stream), so ready streams hold only unacknowledged work and never drop any of it.
  What a batch shares is written once: the finish bucket's expiry entries (one HSET), the
  usage counts (one HINCRBY per tenant and queue), and one event-log entry
  (e=acked, runs='id:tenant:attempt,...', at; docs/design.md). ]]
local events_key, group, bucket_ms = KEYS[1], ARGV[1], tonumber(ARGV[2])
local now_override, event_cap, wake_channel, shard = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local tag = string.sub(events_key, 1, -7)

--!include lib/bodies.lua
--!include lib/record.lua
--!include lib/delivery.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/usage.lua
--!include lib/wake.lua
--!include lib/events.lua
--!include lib/schedule.lua

local n = delivery_ack_all(KEYS, ARGV, 7, 4, group)
local now = clock_now_ms(now_override)
local now_packed = cmsgpack.pack(now)  -- every finished record's updated
-- meta, read once with the body layout: where the near level ends, and the event log's
-- archive mark.
local meta = body_meta(tag, 'promoted_until', 'archived', 'archive_cap')
local promoted_until = tonumber(meta[1]) or 0
local record_of = delivery_loader(tag, ARGV, 7, 4, n, promoted_until)
local codes, acked, retained, tally, woken, done = delivery_array(ARGV, n), {}, {}, {}, 0, 0
-- ':<attempt>' for the event's run list, formatted once per attempt number met; each
-- attempt's text as a number, once per text; a finished record's first bytes, by attempt.
local marks, numbers, heads = {}, {}, {}
local at = 7
for i = 1, n do
  local run_id, text = ARGV[at + 2], ARGV[at + 3]
  local attempt = numbers[text] or delivery_number(numbers, text)
  at = at + 4
  local r, bkey, field, raw = record_of(i)
  if r == nil then
    codes[i] = -1
  elseif r[R_ATTEMPT] ~= attempt or
      (r[R_STATE] ~= ST_DISPATCHED and r[R_STATE] ~= ST_SCHEDULED) then
    codes[i] = 0
  else
    local tenant = r[R_TENANT]
    if r[R_STATE] == ST_SCHEDULED then
      wheel_remove(tag, run_id, tenant, r[R_DUE], bucket_ms, r[R_QUEUE])
    end
    record_finish(bkey, field, r, raw, ST_SUCCEEDED, now, now_packed, heads)
    done = done + 1
    retained[done] = run_id
    if usage_counted(r) then
      usage_tally(tally, tenant, r[R_QUEUE], -#(r[R_PAYLOAD] or ''), -1)
    end
    if r[R_SCHEDULE] and
        schedule_run_finished(tag, r[R_SCHEDULE], run_id, now, bucket_ms) == 1 then
      woken = 1
    end
    local mark = marks[attempt]
    if mark == nil then
      mark = ':' .. string.format('%d', attempt)
      marks[attempt] = mark
    end
    acked[done] = run_id .. ':' .. tenant .. mark
    codes[i] = 1
  end
end
if done > 0 then
  wheel_retain_many(tag, retained, now, bucket_ms)
  usage_flush(tag, tally)
  wake_publish(woken, wake_channel, shard)
  event_emit_marked(events_key, event_cap_for(event_cap, done), meta[2], meta[3],
    'e', 'acked', 'runs', table.concat(acked, ','), 'at', string.format('%d', now))
end
return codes
