-- The shard's event log: a capped stream written by the same script that made the
-- change (docs/design.md).
--
--   event_emit(events_key, cap, field, value, ...)   XADD one entry and trim the log.
--   event_emit_marked(events_key, cap, archived, archive_cap, field, value, ...)   the
--       same, for a caller that read meta's 'archived' and 'archive_cap' with its own
--       fields of meta (one HMGET).
--   event_cap_for(cap, runs)   the cap to pass for an entry that names `runs` runs.
--
-- The cap counts runs: an entry that names n runs (a batched create, a tick, a batch of
-- acks) is written against cap / n entries, so the log holds about the newest `cap`
-- runs' events whatever the batch sizes, and its bytes stay bounded (entries of 500-run
-- batches would otherwise keep 500 times as many runs). Trims are '~', whole stream
-- nodes of at most 100 entries or 4 KB (stream-node-max-*): an entry past 4 KB is a
-- node of its own, so big entries go one by one.
--
-- Trimming. With no archiver, MAXLEN ~ cap: about the newest `cap` entries stay.
-- With an archiver, the shard's meta hash holds 'archived' (id of the newest entry that
-- PostgreSQL holds; the archiver writes it after each commit, and a lagging value only
-- trims less) and 'archive_cap' (the hard cap, in entries). Then the log is trimmed only
-- once it holds more than `cap` entries, and only up to the checkpoint (MINID ~), so no
-- entry the archiver still has to read is dropped. Past 'archive_cap' entries (an
-- archiver stopped for good) MAXLEN ~ archive_cap trims regardless, so Redis cannot fill
-- up; the archiver reports the gap when it comes back. Both trims are '~' (whole stream
-- nodes): O(1) per call. Here `cap` is what the caller passed: event_cap_for's share.
local function event_emit_marked(events_key, cap, archived, archive_cap, ...)
  if not archived then
    redis.call('XADD', events_key, 'MAXLEN', '~', cap, '*', ...)
    return
  end
  redis.call('XADD', events_key, '*', ...)
  local length = redis.call('XLEN', events_key)
  if archive_cap and length > tonumber(archive_cap) then
    redis.call('XTRIM', events_key, 'MAXLEN', '~', archive_cap)
  elseif length > tonumber(cap) then
    redis.call('XTRIM', events_key, 'MINID', '~', archived)
  end
end

local function event_cap_for(cap, runs)
  if runs <= 1 then
    return cap
  end
  return string.format('%d', math.max(1, math.floor(tonumber(cap) / runs)))
end

local function event_emit(events_key, cap, ...)
  local meta = string.sub(events_key, 1, -7) .. 'meta'
  local mark = redis.call('HMGET', meta, 'archived', 'archive_cap')
  event_emit_marked(events_key, cap, mark[1], mark[2], ...)
end
