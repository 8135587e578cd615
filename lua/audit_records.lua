--[[ audit_records: check a shard's run records, one bounded step at a time, body hash by
  body hash in walk order (lib/bodies.lua body_at; docs/operations/auditing.md).
  KEYS[1] meta     HASH tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] scratch  HASH tag..'audit:'..pass, run id -> the attempt it is out with: every
                   run this call finds out (dispatched), for audit_stream to take off and
                   audit_confirm to judge; its TTL is set to ARGV[7]
  ARGV[1] walk position of the body hash to go on from (0 .. 2^20 - 1; lib/bodies.lua: a
          position stays good while hashes split)   ARGV[2] HSCAN cursor within it
  ARGV[3] limit: records examined per call (<= 500; a listpack-encoded hash answers whole,
          so a call reads at most one hash, up to 1,024 records, past it)
  ARGV[4] now_ms override ('' = TIME)   ARGV[5] overdue_ms: a run still in the wheel this
          long after its due time is overdue   ARGV[6] bucket_ms   ARGV[7] scratch TTL ms
  ARGV[8] backlog ('1': the shard has more due than a tick takes, audit_shard)
  ARGV[9] usage ('1': also count what the usage hashes count, and once every body hash is
          read go on with the shard's schedules, SSCAN of tag..'schedules' from position
          2^20)
  Derived keys (same tag): the body hashes (lib/bodies.lua), near:<tenant>, w:<bucket>, s:<sid> and the records of
  its runs, lease, due, rates, tokens, schedules.
  Returns: {position, cursor, examined, {key, n, ...}, findings...}   the body hash's
           walk position and HSCAN cursor to go on from (2^20: every hash is read; with
           usage, 2^20 is the schedules' SSCAN and 2^20 + 1 the end); per near level and far bucket,
           the scheduled runs this call found in it (audit_near and audit_far read member
           by member only a key whose size these counts do not explain);
           findings 6 values each: kind, tenant, id, reason, detail, data
           (timewheel/audit/calls.py). With usage the per-key list also holds what this
           call found of each field of the usage hashes (lib/usage.lua):
           '#uq:'..tenant..'|'..queue  counted runs not finished (scheduled or dispatched,
                                       usage_counted) and schedules of the queue (q:<queue>)
           '#us:'..tenant              schedules (schedules)
           '#ub:'..tenant              payload bytes of those runs and schedules and of the
                                       tenant's dead-lettered runs (bytes)
  Errors:  none.
  Checks per record: it decodes (record_corrupt); a scheduled run is in a level (the one
  its due time names is looked at first; audit_near finds a run in both); one due more
  than overdue_ms ago is overdue, with why; a run held back
  by its schedule (overlap buffer_one) is out of the wheel on purpose while the schedule's
  run in flight is out (held_stuck otherwise). A scheduled run in no level, and a
  dispatched one, is out (or lost from the wheel): it goes to the scratch hash, and its
  ready stream decides. ]]
local rcall = redis.call
local meta_key, scratch_key = KEYS[1], KEYS[2]
local index, cursor, limit = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local now_override, overdue_ms, bucket_ms = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local scratch_ttl, backlog = ARGV[7], ARGV[8] == '1'
local usage = ARGV[9] == '1'
local tag = string.sub(meta_key, 1, -5)

--!include lib/bodies.lua
--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/schedule.lua
--!include lib/usage.lua
--!include lib/audit.lua

local now = clock_shard_ms(meta_key, now_override)
local promoted = wheel_promoted_until(meta_key)
local ctx = audit_ctx(tag, now, backlog)
local placed = {}  -- near level or far bucket -> runs of this call found there;
-- and with usage '#u?:' keys -> what this call found of a usage field (see the header)
local out = { 0, '0', 0, {} }
local wrote = false

local function out_with(run_id, attempt)
  rcall('HSET', scratch_key, run_id, attempt)
  wrote = true
end

local function count(key, n)
  placed[key] = (placed[key] or 0) + n
end

local function held_ok(sid)
  local inflight = rcall('HGET', schedule_key(tag, sid), 'inflight')
  if not inflight then
    return false, 'none'
  end
  local ok, live = pcall(schedule_run_live, tag, inflight)
  return ok and live, inflight
end

local function check(run_id, raw)
  local r = audit_decode(raw)
  if r == nil then
    audit_add(out, 'record_corrupt', '', run_id, '', 'its record does not decode')
    return
  end
  local state, tenant, due = r[R_STATE], r[R_TENANT], r[R_DUE]
  if usage then
    local open = state == ST_DISPATCHED or state == ST_SCHEDULED
    if open and usage_counted(r) then
      count('#uq:' .. tenant .. '|' .. r[R_QUEUE], 1)
      count('#ub:' .. tenant, #(r[R_PAYLOAD] or ''))
    elseif state == ST_DEAD then
      count('#ub:' .. tenant, #(r[R_PAYLOAD] or ''))
    end
  end
  if state == ST_DISPATCHED then
    out_with(run_id, r[R_ATTEMPT])
    return
  end
  if state ~= ST_SCHEDULED then
    return
  end
  local level, key = audit_level(tag, run_id, r, promoted, bucket_ms)
  if key then
    placed[key] = (placed[key] or 0) + 1
  end
  if level == 'held' then
    local ok, inflight = held_ok(r[R_SCHEDULE])
    if not ok then
      audit_add(out, 'held_stuck', tenant, run_id, '', 'held back by schedule '
        .. r[R_SCHEDULE] .. ' until its run in flight (' .. inflight
        .. ') finishes, but that run is not out')
    end
  elseif not level then
    out_with(run_id, r[R_ATTEMPT] + 1)
  elseif due < now - overdue_ms then
    audit_add(out, 'overdue', tenant, run_id, audit_late_reason(ctx, tenant, level),
      string.format('due %d, %d ms ago, still in the %s level', due, now - due, level))
  end
end

local shard_chars = wheel_run_id(tag, '')
local examined = 0
while index < BODY_K.WALK and examined < limit do
  local bkey, dropped, after = body_at(tag, index)
  local next_cursor, flat = audit_scan(bkey, cursor, limit - examined)
  for i = 1, #flat, 2 do
    check(body_run_id(shard_chars, dropped, flat[i]), flat[i + 1])
  end
  examined = examined + #flat / 2
  if next_cursor == '0' then
    index, cursor = after, '0'
  else
    cursor = next_cursor
  end
end
-- The schedules, for the usage check: each counts in its queue, in schedules and its
-- payload in bytes (lua/schedule_create.lua).
if usage and index == BODY_K.WALK and examined < limit then
  local reply = rcall('SSCAN', tag .. 'schedules', cursor, 'COUNT', limit - examined)
  for _, sid in ipairs(reply[2]) do
    local s = rcall('HMGET', schedule_key(tag, sid), 'tenant', 'queue', 'payload')
    if s[1] then
      count('#uq:' .. s[1] .. '|' .. (s[2] or ''), 1)
      count('#us:' .. s[1], 1)
      count('#ub:' .. s[1], #(s[3] or ''))
    end
  end
  examined = examined + #reply[2]
  if reply[1] == '0' then
    index, cursor = BODY_K.WALK + 1, '0'
  else
    cursor = reply[1]
  end
end
if wrote then
  rcall('PEXPIRE', scratch_key, scratch_ttl)
end
local counts = out[4]
for key, n in pairs(placed) do
  counts[#counts + 1] = key
  counts[#counts + 1] = n
end
out[1], out[2], out[3] = index, cursor, examined
return out
