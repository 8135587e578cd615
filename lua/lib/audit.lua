-- The audit's reads (docs/operations/auditing.md): what lua/audit_*.lua share. They
-- decode records defensively, tell where a run sits in the wheel, and collect findings.
-- Calls lib/record.lua, lib/wheel.lua, lib/schedule.lua and lib/rate.lua (before it in
-- LIBS). r below is a record as record_read gives it.
--
--   (a shard's body hashes are walked with lib/bodies.lua body_at and body_run_id.)
--   audit_scan(key, cursor, count) -> cursor, flat   one bounded HSCAN step.
--   audit_sound(r, n) -> ok   whether n decoded values have a record's shape;
--       audit_values(ok, ...), audit_head_values(ok, offset, ...) -> r | nil   pcall's
--       answer of cmsgpack.unpack, or of unpack_limit, as a record.
--   audit_decode(raw, head) -> r | nil   a record, or nil when it does not decode into
--       one; with head, only its first five values (state .. queue), cheaper.
--   audit_read(tag, run_id, head) -> r | nil, raw   the stored record (r nil: none or
--       corrupt; raw tells which), whole or its head.
--   audit_bucket(due_ms, bucket_ms) -> text   the far bucket start of a due time.
--   audit_where(tag, run_id, r, bucket_ms) -> near_score | nil, in_far, held   where a
--       stored-as-scheduled run is: its near level score, whether its far (or distant)
--       bucket holds it, whether its schedule holds it back (overlap buffer_one).
--   audit_level(tag, run_id, r, promoted, bucket_ms) -> 'near' | 'far' | 'held' | 'parked' | false,
--       key   the same, in as few lookups as a sound run needs (promoted: promoted_until),
--       and the near level or far (or distant) bucket holding it.
--   audit_sent_attempt(tag, run_id, r, promoted, bucket_ms) -> attempt | nil   the attempt
--       a run is out with: a record that says dispatched, or one that says scheduled and
--       sits in no level and is not held (sent, or lost from the wheel: only the ready
--       stream tells); nil for a run that is not out.
--   audit_visibility_ms(r, default_ms) -> ms   the run's executor lease.
--   audit_late_reason(ctx, tenant, level) -> reason   why a run of this level ('near' or
--       'far', 'parked') is late: 'backlog' for a parked run (its stream over its cap),
--       'unowned' (no lease: no scheduler node holds the shard),
--       'rate_held' (dispatch_rate holds the tenant back: its due entry is in the future),
--       'backlog' (more is due in the shard than a tick takes), else 'unknown' (a far
--       run of an owned shard: the promoter has not moved it).
--   audit_ctx(tag, now, backlog) -> ctx   the per-call cache audit_late_reason reads.
--   audit_add(out, kind, tenant, id, reason, detail, data)   one finding: six values
--       appended to out (timewheel/audit/calls.py reads them in this order).
--   audit_id_parts(id) -> ms, seq;  audit_id_after(a, b)   whether stream entry id a
--       comes after id b.

local function audit_scan(key, cursor, count)
  local reply = redis.call('HSCAN', key, cursor, 'COUNT', count)
  return reply[1], reply[2]
end

-- A record is up to 12 msgpack values; the first five must be a state, an attempt, a
-- due time, a tenant and a queue (nil: the queue 'default'; what is stored short is
-- given in full here as record_expand gives it). Bytes that are not msgpack, or msgpack of
-- another shape (any byte below 0x80 alone is a valid number), are not a record.
local function audit_sound(r, n)
  if type(r[R_DUE]) == 'number' and (r[R_CREATED] == nil or type(r[R_CREATED]) == 'number') then
    record_expand(r)
  elseif r[R_QUEUE] == nil then
    r[R_QUEUE] = 'default'
  end
  local state = r[R_STATE]
  return n >= 5 and n <= 12 and type(state) == 'number' and state >= ST_SCHEDULED
    and state <= ST_SKIPPED and type(r[R_ATTEMPT]) == 'number' and r[R_ATTEMPT] >= 0
    and type(r[R_DUE]) == 'number' and type(r[R_TENANT]) == 'string' and r[R_TENANT] ~= ''
    and type(r[R_QUEUE]) == 'string' and (r[R_OPTS] == nil or type(r[R_OPTS]) == 'string')
    and (r[R_SCHEDULE] == nil or type(r[R_SCHEDULE]) == 'string')
end

local function audit_values(ok, ...)
  if not ok then
    return nil
  end
  local r = { ... }
  if not audit_sound(r, select('#', ...)) then
    return nil
  end
  return r
end

-- The first five values only (state .. queue): what a wheel member is checked against.
local function audit_head_values(ok, _, ...)
  if not ok then
    return nil
  end
  local r = { ... }
  if not audit_sound(r, 5) or select('#', ...) ~= 5 then
    return nil
  end
  return r
end

local function audit_decode(raw, head)
  if head then
    return audit_head_values(pcall(cmsgpack.unpack_limit, raw, 5))
  end
  return audit_values(pcall(cmsgpack.unpack, raw))
end

local function audit_read(tag, run_id, head)
  local _, bkey, field = run_place(tag, run_id)
  local raw = redis.call('HGET', bkey, field)
  if not raw then
    return nil, nil
  end
  return audit_decode(raw, head), raw
end

local function audit_bucket(due_ms, bucket_ms)
  return string.format('%d', due_ms - (due_ms % bucket_ms))
end

local function audit_where(tag, run_id, r, bucket_ms)
  local near = redis.call('ZSCORE', tag .. 'near:' .. r[R_TENANT], run_id)
  local far = wheel_far_or_distant(tag, wheel_member(run_id), r[R_DUE], bucket_ms) ~= nil
  local held = r[R_SCHEDULE] ~= nil
    and redis.call('HGET', schedule_key(tag, r[R_SCHEDULE]), 'held') == run_id
  return near, far, held
end

-- Where a stored-as-scheduled run is, looking first where its due time says it should
-- be (one lookup for a sound run): 'near', 'far', 'held' (out of the wheel, its schedule
-- holds it back), 'parked' (in its pair's park set, lib/park.lua: its stream is over its
-- backlog cap), or false (in no level); and for 'near' and 'far' the key that holds it.
-- A run in both levels reads as the one looked at first; the other level then holds a
-- member no record accounts for, which audit_near or audit_far reads.
local function audit_level(tag, run_id, r, promoted, bucket_ms)
  local due = r[R_DUE]
  if due >= promoted then
    local key = wheel_far_or_distant(tag, wheel_member(run_id), due, bucket_ms)
    if key then
      return 'far', key
    end
  end
  local near_key = tag .. 'near:' .. r[R_TENANT]
  if redis.call('ZSCORE', near_key, run_id) then
    return 'near', near_key
  elseif due < promoted then
    local key = wheel_far_or_distant(tag, wheel_member(run_id), due, bucket_ms)
    if key then
      return 'far', key
    end
  end
  if r[R_SCHEDULE] ~= nil
      and redis.call('HGET', schedule_key(tag, r[R_SCHEDULE]), 'held') == run_id then
    return 'held'
  end
  if redis.call('ZSCORE', tag .. 'park:' .. r[R_TENANT] .. ':' .. r[R_QUEUE], run_id) then
    return 'parked'
  end
  return false
end

-- record_sent (lib/record.lua) without its promoted_until test: a run the promoter moved
-- into the near level while it was still draining buckets (promoted_until not yet past
-- it) may be sent already, and reads as scheduled until promoted_until moves on.
local function audit_sent_attempt(tag, run_id, r, promoted, bucket_ms)
  if r[R_STATE] == ST_DISPATCHED then
    return r[R_ATTEMPT]
  end
  if r[R_STATE] ~= ST_SCHEDULED or audit_level(tag, run_id, r, promoted, bucket_ms) then
    return nil
  end
  return r[R_ATTEMPT] + 1
end

local function audit_visibility_ms(r, default_ms)
  local opts = r[R_OPTS]
  if opts and string.find(opts, 'visibility_timeout_s', 1, true) then
    local ok, o = pcall(cjson.decode, opts)
    if ok and type(o) == 'table' and tonumber(o.visibility_timeout_s) then
      return tonumber(o.visibility_timeout_s) * 1000
    end
  end
  return default_ms
end

local function audit_ctx(tag, now, backlog)
  return { tag = tag, now = now, backlog = backlog, lease = nil, reasons = {} }
end

local function audit_late_reason(ctx, tenant, level)
  if level == 'parked' then
    return 'backlog'  -- its stream is over the backlog cap (lib/park.lua)
  end
  if ctx.lease == nil then
    ctx.lease = redis.call('EXISTS', ctx.tag .. 'lease') == 1
  end
  if not ctx.lease then
    return 'unowned'
  elseif level == 'far' then
    return 'unknown'
  end
  local reason = ctx.reasons[tenant]
  if reason then
    return reason
  end
  local rate = rate_buckets(ctx.tag, { tenant }, ctx.now)
  local due = tonumber(redis.call('ZSCORE', ctx.tag .. 'due', tenant))
  if rate[tenant] and due and due > ctx.now then
    reason = 'rate_held'
  elseif ctx.backlog then
    reason = 'backlog'
  else
    reason = 'unknown'
  end
  ctx.reasons[tenant] = reason
  return reason
end

local function audit_add(out, kind, tenant, id, reason, detail, data)
  local n = #out
  out[n + 1], out[n + 2], out[n + 3] = kind, tenant or '', id or ''
  out[n + 4], out[n + 5], out[n + 6] = reason or '', detail or '', data or ''
end

local function audit_id_parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms) or 0, tonumber(seq) or 0
end

local function audit_id_after(a, b)
  local ams, aseq = audit_id_parts(a)
  local bms, bseq = audit_id_parts(b)
  return ams > bms or (ams == bms and aseq > bseq)
end
