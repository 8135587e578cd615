-- Deliveries: the entries of the ready streams (tag..'q:'..tenant..':'..queue) that the
-- tick adds for each run it sends (docs/concepts/runs.md) and executors read in a consumer
-- group. Calls lib/record.lua.
--
--   delivery_done(stream_key, group, entry_id)   acknowledge the entry and delete it, so
--       a ready stream holds only unacknowledged work and never drops any of it.
--   delivery_reports(keys, argv, first, width, group) -> reports   the runs of a batched
--       report (run_ack, run_fail): from argv[first] on, `width` values per run, the first
--       four being a stream's index among keys (keys[1 + index]), entry id, run id and
--       attempt. Each report is {stream, entry, run_id, attempt, at} (at: its first value
--       in argv). Every entry is acknowledged in `group` and deleted first, one XACK and
--       one XDEL per stream, whatever becomes of its run.
--   delivery_loader(tag, reports, promoted_until) -> load   the records of a batch's runs,
--       read up front with one ZMSCORE per tenant for the sent test (record_sent),
--       and one HLEN of the shard's parked pairs, so a shard with none (the usual case)
--       pays no park lookup per run;
--       load(i) -> r, bkey, field, raw is report i's record as record_load gives it,
--       where it lives (run_place, worked out once per run) and the record as stored. A
--       run met a second time in the call, and a schedule's run (whose end may put
--       another run of the schedule back in the wheel), is read again when its turn comes.
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

local function delivery_loader(tag, reports, promoted_until)
  local records, keys, fields, raws, unsent = {}, {}, {}, {}, {}
  for i, report in ipairs(reports) do
    local run_id = report[3]
    local _, bkey, field = run_place(tag, run_id)
    local raw = redis.call('HGET', bkey, field)
    local r = nil
    if raw then
      r = { cmsgpack.unpack(raw) }
    end
    records[i], keys[i], fields[i], raws[i] = r, bkey, field, raw
    if r and r[R_STATE] == ST_SCHEDULED and r[R_SCHEDULE] == nil then
      local ids = unsent[r[R_TENANT]]
      if ids == nil then
        ids = {}
        unsent[r[R_TENANT]] = ids
      end
      ids[#ids + 1] = run_id
    end
  end
  local near = {}
  for tenant, ids in pairs(unsent) do
    local scores = redis.call('ZMSCORE', tag .. 'near:' .. tenant, unpack(ids))
    for j, run_id in ipairs(ids) do
      if scores[j] then
        near[run_id] = true
      end
    end
  end
  -- false: no parked run in the shard, so record_sent need not look per run.
  local parked = nil
  if redis.call('HLEN', tag .. 'parked') == 0 then
    parked = false
  end
  local seen = {}
  return function(i)
    local run_id, r, bkey, raw = reports[i][3], records[i], keys[i], raws[i]
    if seen[run_id] or (r and r[R_SCHEDULE] ~= nil) then
      r, raw = record_load(bkey, run_id, promoted_until)
    elseif r and r[R_STATE] == ST_SCHEDULED and
        record_sent(tag, run_id, r, promoted_until, near[run_id] == true, parked) then
      r[R_STATE], r[R_ATTEMPT], r.sent = ST_DISPATCHED, r[R_ATTEMPT] + 1, true
    end
    seen[run_id] = true
    return r, bkey, fields[i], raw
  end
end

local function delivery_live(r, attempt)
  return r[R_STATE] == ST_DISPATCHED and r[R_ATTEMPT] == attempt
end
