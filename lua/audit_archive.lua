--[[ audit_archive: how far the archiver is behind one shard's event log (read only;
  timewheel/audit/continuous.py).
  KEYS[1] meta    HASH tag..'meta' (fields archived: the archiver's checkpoint, an entry
                  id; archived_at: epoch ms when the archiver last wrote it)
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] most entries counted one by one (bounds the call)
  Returns: {archived, archived_at, behind, length}
           archived is '' when no archiver ever marked the shard (then behind is 0);
           archived_at '' when the mark carries no time. behind counts the entries
           after the checkpoint, exactly up to ARGV[1]; past that the log's length
           (the log is trimmed up to the checkpoint once it is that long, so it holds
           little else: lua/lib/events.lua). length is the log's XLEN.
  Errors:  none. ]]
local rcall = redis.call
local meta_key, events_key = KEYS[1], KEYS[2]
local most = tonumber(ARGV[1])

local mark = rcall('HMGET', meta_key, 'archived', 'archived_at')
local length = rcall('XLEN', events_key)
if not mark[1] then
  return { '', '', 0, length }
end
local behind = #rcall('XRANGE', events_key, '(' .. mark[1], '+', 'COUNT', most)
if behind >= most then
  behind = math.max(behind, length)
end
return { mark[1], mark[2] or '', behind, length }
