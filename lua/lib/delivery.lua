-- Deliveries: the entries of the ready streams (tag..'q:'..tenant..':'..queue) that the
-- tick adds for each run it sends (docs/concepts/runs.md) and executors read in a consumer
-- group. Calls lib/record.lua.
--
--   delivery_done(stream_key, group, entry_id)   acknowledge the entry and delete it, so
--       a ready stream holds only unacknowledged work and never drops any of it.
--   delivery_report(tag, stream_key, group, entry_id, run_id) -> r, bkey   an executor's
--       report on its delivery (run_ack, run_fail): the entry is done with, whatever the
--       run's state; then the run's record (nil: none in this shard) and body hash key.
--   delivery_live(r, attempt)   whether a delivery of this attempt is the run's current
--       one: the record says dispatched, at that attempt.

local function delivery_done(stream_key, group, entry_id)
  redis.call('XACK', stream_key, group, entry_id)
  redis.call('XDEL', stream_key, entry_id)
end

local function delivery_report(tag, stream_key, group, entry_id, run_id)
  delivery_done(stream_key, group, entry_id)
  return record_find(tag, run_id)
end

local function delivery_live(r, attempt)
  return r[R_STATE] == ST_DISPATCHED and r[R_ATTEMPT] == attempt
end
