--[[ audit_archive: how far the archiver is behind one shard's event log (read only;
  timewheel/audit/continuous.py, the archiver_behind check of timewheel/audit/archived.py).
  KEYS[1] meta    HASH tag..'meta' (fields archived: the archiver's checkpoint, an entry
                  id; archived_at: epoch ms when the archiver last wrote it)
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] most entries counted one by one (bounds the call)
  ARGV[2] now_ms override ('' = TIME)
  Returns: {archived, archived_at, behind, length, oldest, now_ms}
           archived is '' when no archiver ever marked the shard (then behind is 0);
           archived_at '' when the mark carries no time. behind counts the entries
           after the checkpoint, exactly up to ARGV[1]; past that the log's length
           (the log is trimmed up to the checkpoint once it is that long, so it holds
           little else: lua/lib/events.lua). length is the log's XLEN. oldest is the id
           of the first entry not archived: the first after the checkpoint, or with no
           mark the log's first entry ('' when there is none). now_ms is the clock the
           age of oldest is judged by.
  Errors:  none. ]]
local rcall = redis.call
local meta_key, events_key = KEYS[1], KEYS[2]
local most, now_override = tonumber(ARGV[1]), ARGV[2]

--!include lib/clock.lua

local now = clock_now_ms(now_override)
local mark = rcall('HMGET', meta_key, 'archived', 'archived_at')
local length = rcall('XLEN', events_key)
if not mark[1] then
  local first = rcall('XRANGE', events_key, '-', '+', 'COUNT', 1)
  return { '', '', 0, length, first[1] and first[1][1] or '', now }
end
local after = rcall('XRANGE', events_key, '(' .. mark[1], '+', 'COUNT', most)
local behind = #after
if behind >= most then
  behind = math.max(behind, length)
end
return { mark[1], mark[2] or '', behind, length, after[1] and after[1][1] or '', now }
