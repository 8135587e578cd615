-- Deliveries: the entries of the ready streams (tag..'q:'..tenant..':'..queue) that the
-- tick adds for each run it sends (docs/concepts/runs.md) and executors read in a consumer
-- group. Calls lib/record.lua.
--
--   delivery_done(stream_key, group, entry_id)   acknowledge the entry and delete it, so
--       a ready stream holds only unacknowledged work and never drops any of it.
--   delivery_ack_all(keys, argv, first, width, group) -> n   the entries of a batched
--       report (run_ack, run_fail): from argv[first] on, `width` values per run, the first
--       four being a stream's index among keys (keys[1 + index]), entry id, run id and
--       attempt. Every entry is acknowledged in `group` and deleted first, one XACK and one
--       XDEL per stream, whatever becomes of its run. Returns the number of runs, n; run i's
--       values start at argv[first + (i - 1) * width].
--   delivery_number(numbers, text) -> number   tonumber(text), kept in numbers (the call's
--       table of them; a caller looks there first): a batch's attempts are mostly one value.
--   delivery_array(argv, n) -> t   a table whose array part has room for n values (it
--       holds argv[1..n] until they are replaced), so filling it needs no rehash.
--   delivery_loader(tag, argv, first, width, n, promoted_until) -> load   the records of a
--       batch's runs, read up front with one ZMSCORE per tenant for the sent test
--       (record_sent), and one HLEN of the shard's parked pairs, so a shard with none (the
--       usual case) pays no park lookup per run;
--       load(i) -> r, bkey, field, raw is run i's record as record_load gives it (a
--       sent run's state and attempt; but without r.sent, which neither caller reads and
--       which would give every record table a hash part),
--       where it lives (run_place, worked out once per run) and the record as stored. A
--       run met a second time in the call, and a schedule's run (whose end may put
--       another run of the schedule back in the wheel), is read again when its turn comes.
--   delivery_live(r, attempt)   whether a delivery of this attempt is the run's current
--       one: the record says dispatched, at that attempt.

local function delivery_done(stream_key, group, entry_id)
  redis.call('XACK', stream_key, group, entry_id)
  redis.call('XDEL', stream_key, entry_id)
end

local function delivery_ack_all(keys, argv, first, width, group)
  -- Entry ids by stream index (its text as sent: one call's runs use one spelling).
  local ids_of, order, counts, n = {}, {}, {}, 0
  for at = first, #argv, width do
    n = n + 1
    local index = argv[at]
    local ids = ids_of[index]
    if ids == nil then
      ids = {}
      ids_of[index] = ids
      order[#order + 1] = index
      counts[index] = 0
    end
    local c = counts[index] + 1
    counts[index] = c
    ids[c] = argv[at + 1]
  end
  for _, index in ipairs(order) do
    local stream, ids = keys[1 + tonumber(index)], ids_of[index]
    redis.call('XACK', stream, group, unpack(ids))
    redis.call('XDEL', stream, unpack(ids))
  end
  return n
end

local function delivery_number(numbers, text)
  local v = numbers[text]
  if v == nil then
    v = tonumber(text)
    numbers[text] = v
  end
  return v
end

local function delivery_array(argv, n)
  return { unpack(argv, 1, n) }
end

local function delivery_loader(tag, argv, first, width, n, promoted_until)
  local records, keys, fields = delivery_array(argv, n), delivery_array(argv, n),
    delivery_array(argv, n)
  local raws, unsent = delivery_array(argv, n), {}
  local call, unpack_record = lib_c.call, lib_c.unpack
  local at = first + 2
  for i = 1, n do
    local run_id = argv[at]
    at = at + width
    local _, bkey, field = run_place(tag, run_id)
    local raw = call('HGET', bkey, field)
    local r = false
    if raw then
      r = record_expand({ unpack_record(raw) })
      if r[R_STATE] == ST_SCHEDULED and r[R_SCHEDULE] == nil then
        local tenant = r[R_TENANT]
        local ids = unsent[tenant]
        if ids == nil then
          ids = { 0 }
          unsent[tenant] = ids
        end
        local c = ids[1] + 1
        ids[1] = c
        ids[c + 1] = run_id
      end
    end
    records[i], keys[i], fields[i], raws[i] = r, bkey, field, raw
  end
  local near = {}
  for tenant, ids in pairs(unsent) do
    local scores = redis.call('ZMSCORE', tag .. 'near:' .. tenant, unpack(ids, 2, ids[1] + 1))
    for j = 1, ids[1] do
      if scores[j] then
        near[ids[j + 1]] = true
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
    local run_id, r, bkey, raw = argv[first + (i - 1) * width + 2], records[i], keys[i], raws[i]
    if seen[run_id] or (r and r[R_SCHEDULE] ~= nil) then
      r, raw = record_load(bkey, run_id, promoted_until)
    elseif not r then
      r = nil
    elseif r[R_STATE] == ST_SCHEDULED and not near[run_id] and
        -- record_sent's answer, without the call in the usual case: a run in no near
        -- level, in a shard with no parked run, due before promoted_until (so in no far
        -- bucket) and of no schedule (a schedule's run is read again above) was sent.
        ((parked == false and r[R_DUE] < promoted_until) or
          record_sent(tag, run_id, r, promoted_until, false, parked)) then
      r[R_STATE], r[R_ATTEMPT] = ST_DISPATCHED, r[R_ATTEMPT] + 1
    end
    seen[run_id] = true
    return r, bkey, fields[i], raw
  end
end

local function delivery_live(r, attempt)
  return r[R_STATE] == ST_DISPATCHED and r[R_ATTEMPT] == attempt
end
