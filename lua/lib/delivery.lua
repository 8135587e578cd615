-- Deliveries: the entries of the ready streams (tag..'q:'..tenant..':'..queue) that the
-- tick adds for each run it sends (docs/concepts/runs.md) and executors read in a consumer
-- group.
--
--   delivery_done(stream_key, group, entry_id)   acknowledge the entry and delete it, so
--       a ready stream holds only unacknowledged work and never drops any of it.
--   delivery_reports(keys, argv, first, width, group) -> reports   the runs of a batched
--       report (run_ack, run_fail): from argv[first] on, `width` values per run, the first
--       four being a stream's index among keys (keys[1 + index]), entry id, run id and
--       attempt. Each report is {stream, entry, run_id, attempt, at} (at: its first value
--       in argv). Every entry is acknowledged in `group` and deleted first, one XACK and
--       one XDEL per stream, whatever becomes of its run.
--   delivery_live(r, attempt)   whether a delivery of this attempt is the run's current
--       one: the record says dispatched, at that attempt.

local function delivery_done(stream_key, group, entry_id)
  redis.call('XACK', stream_key, group, entry_id)
  redis.call('XDEL', stream_key, entry_id)
end

local function delivery_reports(keys, argv, first, width, group)
  local reports, entries, streams = {}, {}, {}
  for at = first, #argv, width do
    local stream = keys[1 + tonumber(argv[at])]
    local ids = entries[stream]
    if ids == nil then
      ids = {}
      entries[stream] = ids
      streams[#streams + 1] = stream
    end
    ids[#ids + 1] = argv[at + 1]
    reports[#reports + 1] = { stream, argv[at + 1], argv[at + 2], tonumber(argv[at + 3]), at }
  end
  for _, stream in ipairs(streams) do
    local ids = entries[stream]
    redis.call('XACK', stream, group, unpack(ids))
    redis.call('XDEL', stream, unpack(ids))
  end
  return reports
end

local function delivery_live(r, attempt)
  return r[R_STATE] == ST_DISPATCHED and r[R_ATTEMPT] == attempt
end
