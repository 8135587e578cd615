-- One run's record, decoded, and where the run sits. KEYS[1] the meta of the run's
-- shard; ARGV[1] the run id; ARGV[2] bucket_ms; ARGV[3] most ready-stream entries to
-- read looking for a dispatched run's entry.
-- Answers 'name value...' lines: run_id, shard, record (body hash and field), state (as it
-- is: a run stored as scheduled that the tick has sent is dispatched, at the next
-- attempt; lua/lib/record.lua), stored (the stored state and attempt, when they differ),
-- attempt, due, tenant, queue, created, updated, payload, options, last_error, schedule,
-- dead_entry, and 'where ...' lines. A run without a record answers 'record none'.
local tag = tw_tag(KEYS[1])
local run_id, bucket_ms, read = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = tw_now(tag)
local bkey, field = tw_body(tag, run_id)
local out = { 'ok', tw_line('run_id', run_id), tw_line('shard', tw_int(tw_shard(tag))) }
local r = tw_record(tag, run_id)
if r == nil then
  out[#out + 1] = tw_line('record', 'none', bkey, field)
  return out
end
out[#out + 1] = tw_line('record', bkey, field)

local state, attempt = r[R_STATE], r[R_ATTEMPT]
if state == 0 and tw_sent(tag, run_id, r) then
  state, attempt = 1, attempt + 1
end

local function when(ms)
  if tonumber(ms) == nil then
    return '-'
  end
  return tw_line(tw_iso(ms), tw_int(ms), string.format('(%+.3fs)', (ms - now) / 1000))
end

out[#out + 1] = tw_line('state', TW_STATES[state] or tw_int(state))
if state ~= r[R_STATE] then
  out[#out + 1] = tw_line('stored', TW_STATES[r[R_STATE]], 'attempt', tw_int(r[R_ATTEMPT]),
    '(the tick sent it without rewriting the record)')
end
out[#out + 1] = tw_line('attempt', tw_int(attempt))
out[#out + 1] = tw_line('due', when(r[R_DUE]))
out[#out + 1] = tw_line('tenant', tw_text(r[R_TENANT]))
out[#out + 1] = tw_line('queue', tw_text(r[R_QUEUE]))
out[#out + 1] = tw_line('created', when(r[R_CREATED]))
out[#out + 1] = tw_line('updated', when(r[R_UPDATED]))
out[#out + 1] = tw_line('payload', tw_text(r[R_PAYLOAD]))
out[#out + 1] = tw_line('options', tw_text(r[R_OPTS]))
out[#out + 1] = tw_line('last_error', tw_text(r[R_ERROR]))
out[#out + 1] = tw_line('schedule', tw_text(r[R_SCHEDULE]))
out[#out + 1] = tw_line('dead_entry', tw_text(r[R_DEAD]))

local function where(...)
  out[#out + 1] = tw_line('where', ...)
end

local tenant = r[R_TENANT]
if state == 0 then
  local near = tag .. 'near:' .. tenant
  local bucket = string.format('%d', r[R_DUE] - r[R_DUE] % bucket_ms)
  local score = redis.call('ZSCORE', near, run_id)
  if score then
    where('near level', near, 'score', score)
  elseif tw_far(tag, bucket, string.sub(run_id, 4)) then
    where('far bucket', tag .. 'w:' .. tw_far(tag, bucket, string.sub(run_id, 4)), 'from',
      tw_iso(bucket))
  elseif r[R_SCHEDULE] and redis.call('HGET', tag .. 's:' .. r[R_SCHEDULE], 'held') == run_id then
    where('held by its schedule', tag .. 's:' .. r[R_SCHEDULE], '(overlap buffer_one)')
  else
    where('in neither level of the wheel')
  end
elseif state == 1 then
  local stream = tag .. 'q:' .. tenant .. ':' .. r[R_QUEUE]
  local entry, seen, start = nil, 0, '-'
  while entry == nil and seen < read do
    local page = redis.call('XRANGE', stream, start, '+', 'COUNT', math.min(500, read - seen))
    if #page == 0 then
      break
    end
    for _, e in ipairs(page) do
      for i = 1, #e[2], 2 do
        if e[2][i] == 'run_id' and e[2][i + 1] == run_id then
          entry = e[1]
        end
      end
    end
    seen = seen + #page
    start = '(' .. page[#page][1]
  end
  if entry == nil then
    where('ready stream', stream, 'entry not found in its first', tw_int(seen), 'entries')
  else
    where('ready stream', stream, 'entry', entry)
    local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
    if not ok or #groups == 0 then
      where('no consumer group reads', stream)
    end
    for _, g in ipairs(ok and groups or {}) do
      local name
      for i = 1, #g, 2 do
        if g[i] == 'name' then
          name = g[i + 1]
        end
      end
      local p = redis.call('XPENDING', stream, name, entry, entry, 1)
      if p[1] then
        where('pending in group', name, 'consumer', p[1][2], 'idle_ms', tw_int(p[1][3]),
          'deliveries', tw_int(p[1][4]))
      else
        where('not yet delivered to group', name)
      end
    end
  end
elseif state == 4 then
  local dead = tag .. 'dead:' .. tenant
  local e = r[R_DEAD] and redis.call('XRANGE', dead, r[R_DEAD], r[R_DEAD])[1]
  if e then
    where('dead letters', dead, 'entry', r[R_DEAD])
  else
    where('no dead letter in', dead)
  end
else
  local finished = tonumber(r[R_UPDATED])
  local bucket = finished and string.format('%d', finished - finished % bucket_ms)
  if bucket and redis.call('LPOS', tag .. 'xl:' .. bucket, run_id) then
    where('finished, kept for retention in', tag .. 'xl:' .. bucket)
  elseif bucket and redis.call('HEXISTS', tag .. 'x:' .. bucket, run_id) == 1 then
    where('finished, kept for retention in', tag .. 'x:' .. bucket)
  else
    where('finished, not in a retention bucket')
  end
end
return out
