--[[ schedule_add_runs: runs asked for by hand: trigger (one run now) or backfill (every
  fire time of a past range, in order). They are exempt from catchup and overlap.
  KEYS[1] meta      HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] schedule  HASH   tag..'s:'..sid
  KEYS[3] events    STREAM tag..'events'
  ARGV[1] sid   ARGV[2] tenant   ARGV[3] origin: 'manual' (one run now, run id
          '<sid>@manual-<now ms>') or 'backfill' (run ids '<sid>@<fire ms>', due at their
          fire times, so they go out at once, oldest first)
  ARGV[4] fire times for backfill, ascending, comma-separated   ARGV[5] bucket_ms
  ARGV[6] now_ms override ('' = TIME)   ARGV[7] event log cap   ARGV[8] wake channel
  ('' = none)   ARGV[9] shard number
  ARGV[10] cap ('' or absent = none): the most counted runs not finished (lib/usage.lua,
          usage_held) the shard may hold for the tenant after the call (its share of
          max_pending: timewheel/limits.py); the runs to add are all added or all refused
  Derived keys (same tag): t:<xy>, near:<tenant>, due, w:<bucket>, wheel, use:<tenant>
  (runs asked for by hand count like tasks: q:<queue>, bytes; lib/usage.lua).
  Returns: {1, added, existing, first run id}   existing: run ids that were there already
           (a fire time that ran, or was backfilled, before: not run twice)
           {3, held, cap}   refused: the runs not there yet would pass the cap (nothing
                            written; held = the tenant's counted runs not finished here)
  Errors:  {-1} NOT_FOUND     no such schedule for this tenant
  Events:  a 'created' entry for the runs added (runs = 'id:tenant:queue:due_ms,...', as
           task_create writes), so the archive knows their tenant from the start, then
           'triggered' or 'backfilled' naming the schedule. ]]
local meta_key, skey, events_key = KEYS[1], KEYS[2], KEYS[3]
local sid, tenant, origin, backfill_fires = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local bucket_ms, now_override, event_cap = tonumber(ARGV[5]), ARGV[6], ARGV[7]
local wake_channel, shard, cap = ARGV[8], ARGV[9], tonumber(ARGV[10] or '')
local tag = string.sub(meta_key, 1, -5)

--!include lib/bodies.lua
--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/usage.lua
--!include lib/wake.lua
--!include lib/events.lua
--!include lib/schedule.lua

local s = schedule_owned(skey, tenant)
if s == nil then
  return { -1 }
end
local now = clock_now_ms(now_override)
local opts = schedule_opts(s)
opts.origin = origin
local opts_json = cjson.encode(opts)
local runs = {}
if origin == 'manual' then
  runs[1] = { sid .. '@manual-' .. now, now }
else
  for _, fire in ipairs(schedule_fires(backfill_fires)) do
    runs[#runs + 1] = { sid .. '@' .. fire, fire }
  end
end
if cap ~= nil then
  local held = usage_held(usage_key(tag, tenant))
  if held + #runs > cap then
    -- Only the runs not there yet would count (a fire time backfilled before is not).
    local new = 0
    for _, run in ipairs(runs) do
      if redis.call('HEXISTS', body_key(tag, run[1]), body_field(run[1])) == 0 then
        new = new + 1
      end
    end
    if new > 0 and held + new > cap then
      return { 3, held, cap }
    end
  end
end
local added, existing, wake, tally, created = 0, 0, 0, {}, {}
for _, run in ipairs(runs) do
  local run_id, due = run[1], run[2]
  local rec = record_pack({ ST_SCHEDULED, 0, due, tenant, s.queue, now, s.payload, opts_json,
    nil, nil, sid, nil })
  if record_create(tag, run_id, rec) == 1 then
    if wheel_place(tag, meta_key, run_id, tenant, due, bucket_ms) == 1 then
      wake = 1
    end
    added = added + 1
    created[#created + 1] = run_id .. ':' .. tenant .. ':' .. s.queue .. ':' ..
      string.format('%d', due)
    usage_tally(tally, tenant, s.queue, #s.payload)
  else
    existing = existing + 1
  end
end
if #created > 0 then
  event_emit(events_key, event_cap_for(event_cap, #created), 'e', 'created',
    'at', string.format('%d', now), 'runs', table.concat(created, ','))
end
event_emit(events_key, event_cap, 'e', origin == 'manual' and 'triggered' or 'backfilled',
  'id', sid, 'tenant', tenant, 'at', now, 'runs', #runs)
usage_flush(tag, tally)
wake_publish(wake, wake_channel, shard)
return { 1, added, existing, runs[1] and runs[1][1] or '' }
