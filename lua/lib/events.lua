-- The shard's event log: a capped stream written by the same script that made the
-- change (docs/design.md).
--
--   event_emit(events_key, cap, field, value, ...)   XADD one entry and trim the log.
--
-- Trimming. With no archiver, MAXLEN ~ cap: about the newest `cap` entries stay.
-- With an archiver, the shard's meta hash holds 'archived' (id of the newest entry that
-- PostgreSQL holds; the archiver writes it after each commit, and a lagging value only
-- trims less) and 'archive_cap' (the hard cap). Then the log is trimmed only once it holds
-- more than `cap` entries, and only up to the checkpoint (MINID ~), so no entry the archiver
-- still has to read is dropped. Past 'archive_cap' entries (an archiver stopped for good)
-- MAXLEN ~ archive_cap trims regardless, so Redis cannot fill up; the archiver reports
-- the gap when it comes back. Both trims are '~' (whole stream nodes): O(1) per call.
local function event_emit(events_key, cap, ...)
  local meta = string.sub(events_key, 1, -7) .. 'meta'
  local mark = redis.call('HMGET', meta, 'archived', 'archive_cap')
  if not mark[1] then
    redis.call('XADD', events_key, 'MAXLEN', '~', cap, '*', ...)
    return
  end
  redis.call('XADD', events_key, '*', ...)
  local length = redis.call('XLEN', events_key)
  if mark[2] and length > tonumber(mark[2]) then
    redis.call('XTRIM', events_key, 'MAXLEN', '~', mark[2])
  elseif length > tonumber(cap) then
    redis.call('XTRIM', events_key, 'MINID', '~', mark[1])
  end
end
