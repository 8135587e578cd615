-- The shard's event log: a capped stream written by the same script that made the
-- change (DESIGN.md section 3). The archiver (a later issue) bounds trimming.
local function event_emit(events_key, cap, ...)
  redis.call('XADD', events_key, 'MAXLEN', '~', cap, '*', ...)
end
