-- Task records. A record is up to 12 msgpack values packed back to back (no array
-- header, trailing nils left out), stored as one field of a per-shard body hash. Two
-- values are stored short (records written before hold them in full, and read the same):
-- the queue named 'default' as nil (1 byte, not 8), and created as created - due, a
-- negative number (5 bytes, not 9: an absolute time never is), when the run was created
-- 1 ms to 2^31 ms (24.8 days) before it is due. record_expand and record_pack translate. Python
-- reads it in timewheel/store/record.py; the field order below is the contract between the two.
-- Calls lib/wheel.lua and lib/bodies.lua. r below is a record unpacked into a table, indexed by R_*.
--
--   R_STATE ... R_DEAD, ST_SCHEDULED ... ST_SKIPPED   field positions and states.
--   run_place(tag, run_id) -> task_id, bkey, field   where a run's record lives
--       (lib/bodies.lua body_locate); body_key(tag, run_id) -> bkey and body_field(run_id)
--       -> field give one part.
--   record_expand(r) -> r   what a record stores short, in full, in place (queue, created);
--       record_unpack(raw) -> r   a record's values so; record_created_stored(created, due)
--       -> value   the created time as a record stores it.
--   record_read(bkey, run_id) -> r, raw   the record as stored (nil if none).
--   record_load(bkey, run_id, promoted_until) -> r, raw   the record as it is: a sent
--       run says dispatched (promoted_until optional, as for record_sent).
--   record_sent(tag, run_id, r, promoted_until, near, parked)   whether a
--       stored-as-scheduled run has been sent (promoted_until optional: a call handling
--       many runs reads it once; near optional: whether the run is in its tenant's near
--       level, when the caller looked it up already, else nil; parked optional: false
--       when the caller knows the shard has no parked run, else nil).
--   record_find(tag, run_id) -> r, bkey   record_load from the run id alone.
--   record_owned(bkey, run_id, tenant) -> r   record_load, nil if another tenant's.
--   record_scheduled(bkey, run_id, tenant) -> r | nil, refusal   a tenant's run that is
--       still scheduled, or the NOT_FOUND / INVALID_STATE reply.
--   record_pack(r) -> raw;  record_create(tag, run_id, raw) -> 1 | 0 (HSETNX into the
--       run's body hash; a new record counts in the shard's body layout, lib/bodies.lua);
--   record_put(bkey, run_id, raw);  record_save(bkey, run_id, r, field) -> raw (field:
--       the run's field in bkey when the caller has it, else worked out);
--   record_delete(bkey, run_id).
--   record_finish(bkey, field, r, raw, state, now, now_packed, heads)   a run ends: r, as
--       read from raw (with a sent run's state and attempt), takes `state` and updated = now
--       (now_packed = cmsgpack.pack(now), once per call) and is written to field of bkey;
--       heads (optional): a table a call finishing many runs in one state keeps for it.
--   record_retried(raw, r, due, due_packed, now_packed, error_packed, heads) -> out | nil
--       the bytes record_pack gives for r, read from raw (with a sent run's state and
--       attempt), once it waits for a retry: state scheduled, due (a created time stored
--       short taken again from it), updated and error taken from the packed values given;
--       nil when raw is not in a form patched (then pack r whole).
--       heads (optional): as for record_finish.
--   record_head(heads, state, attempt) -> bytes   a record's first two bytes for a small
--       state and attempt (one byte each), made once per attempt into heads (optional).
--   lib_c (lib/bodies.lua)   the C functions the per-run paths call, bound once.
local R_STATE, R_ATTEMPT, R_DUE, R_TENANT, R_QUEUE, R_CREATED = 1, 2, 3, 4, 5, 6
local R_PAYLOAD, R_OPTS, R_UPDATED, R_ERROR, R_SCHEDULE, R_DEAD = 7, 8, 9, 10, 11, 12
local ST_SCHEDULED, ST_DISPATCHED, ST_SUCCEEDED, ST_CANCELLED, ST_DEAD = 0, 1, 2, 3, 4
-- A schedule's run that was not sent: misfire or overlap (docs/design.md).
local ST_SKIPPED = 5

-- Where a run lives, in one pass over its id: its task id (the run id before any '@'),
-- its body hash and its field there (lib/bodies.lua: the shard's hashes split as it grows).
-- '03f1gy61ezezgb00' in a shard at level 10 -> 't:00', '1gy61ezezgb';
-- '03f1gy61ezezgb00@1795979241606' at level 3 -> 't3:0', '1gy61ezezgb00@1795979241606'
local run_place = body_locate

local function body_key(tag, run_id)
  local _, key = body_locate(tag, run_id)
  return key
end

-- What a record stores short, in full: the queue 'default' (stored as nil) and its
-- created time (stored as created - due when negative). r is changed in place.
local function record_expand(r)
  if r[R_QUEUE] == nil then
    r[R_QUEUE] = 'default'
  end
  local created = r[R_CREATED]
  if created and created < 0 then
    r[R_CREATED] = r[R_DUE] + created
  end
  return r
end

local function record_unpack(raw)
  return record_expand({ cmsgpack.unpack(raw) })
end

-- created - due when that is 1 ms to 2^31 ms before due (an int32), else created itself.
local function record_created_stored(created, due)
  local short = created - due
  if short >= 0 or short < -2147483648 then
    return created
  end
  return short
end

-- A record as stored. The wheel's own moves (tick, promote) read this way: the runs
-- they handle are in the wheel, scheduled by definition.
local function record_read(bkey, run_id)
  local raw = redis.call('HGET', bkey, body_field(run_id))
  if not raw then
    return nil, nil
  end
  return record_unpack(raw), raw
end

-- Whether a run whose record says scheduled has been sent. The tick does not rewrite a
-- record when it sends the run (that 200-byte rewrite was a third of a dispatch): it
-- only takes the run out of its tenant's near level. So a scheduled run that is in
-- neither level of the wheel, and is not held back by its schedule's overlap policy,
-- is out at its next attempt. A run due before the shard's promoted_until can only be
-- in the near level; a later one is in its far bucket (or its distant bucket, lib/wheel.lua),
-- or, while the promoter drains
-- that bucket in several calls (more than promote_batch runs), already moved to the
-- near level and perhaps sent, although promoted_until is still before it. The far
-- bucket is the wheel index's latest bucket starting at or before the run's due time.
-- A parked run (its stream over its backlog cap, lib/park.lua) is in its pair's park set.
-- Every move that puts a run back (retry, release, replay, reschedule) places it in the
-- wheel in the same call.
local function record_sent(tag, run_id, r, promoted_until, near, parked)
  if near == nil then
    near = redis.call('ZSCORE', tag .. 'near:' .. r[R_TENANT], run_id)
  end
  if near then
    return false
  end
  -- Parked (lib/park.lua): out of the near level, still in the wheel.
  if parked ~= false and
      redis.call('ZSCORE', tag .. 'park:' .. r[R_TENANT] .. ':' .. r[R_QUEUE], run_id) then
    return false
  end
  local due = r[R_DUE]
  if due >= (promoted_until or wheel_promoted_until(tag .. 'meta')) then
    local member = wheel_member(run_id)
    local latest = redis.call('ZRANGE', tag .. 'wheel', due, '-inf', 'BYSCORE', 'REV', 'LIMIT',
      0, 1, 'WITHSCORES')
    if latest[2] and wheel_far(tag, latest[2], member) then
      return false
    end
    -- or still in its distant bucket: the distant index's latest start at or before it
    latest = redis.call('ZRANGE', tag .. 'distant', due, '-inf', 'BYSCORE', 'REV', 'LIMIT',
      0, 1, 'WITHSCORES')
    if latest[2] and wheel_distant(tag, latest[2], member) then
      return false
    end
  end
  return not (r[R_SCHEDULE] and redis.call('HGET', tag .. 's:' .. r[R_SCHEDULE], 'held') == run_id)
end

-- A record as it is: a sent run says dispatched, at the attempt it was sent with
-- (r.sent marks the difference from what is stored: raw no longer tells the run as it
-- is; record_save writes it).
local function record_load(bkey, run_id, promoted_until)
  local r, raw = record_read(bkey, run_id)
  if r and r[R_STATE] == ST_SCHEDULED and
      record_sent(body_tag(), run_id, r, promoted_until) then
    r[R_STATE], r[R_ATTEMPT], r.sent = ST_DISPATCHED, r[R_ATTEMPT] + 1, true
  end
  return r, raw
end

-- A run's record found from its id alone (record_load), and its body hash key.
local function record_find(tag, run_id)
  local bkey = body_key(tag, run_id)
  return (record_load(bkey, run_id)), bkey
end

-- A tenant's record (record_load), or nil: none, or another tenant's (which to this
-- tenant does not exist).
local function record_owned(bkey, run_id, tenant)
  local r = record_load(bkey, run_id)
  if r == nil or r[R_TENANT] ~= tenant then
    return nil
  end
  return r
end

-- A tenant's run that must still be scheduled (cancel, update): its record, or nil and
-- the reply refusing the call: {-1} NOT_FOUND or {-2, state} INVALID_STATE.
local function record_scheduled(bkey, run_id, tenant)
  local r = record_owned(bkey, run_id, tenant)
  if r == nil then
    return nil, { -1 }
  end
  if r[R_STATE] ~= ST_SCHEDULED then
    return nil, { -2, r[R_STATE] }
  end
  return r
end

-- Write a packed record only if the run has none: 1 if written, 0 if one was there.
-- A new record counts in the shard's body layout, which may split a hash (lib/bodies.lua);
-- a shard's first record settles its layout.
local function record_create(tag, run_id, raw)
  if not body_layout(tag).settled then
    body_settle(tag)
  end
  local _, key, field = body_locate(tag, run_id)
  if redis.call('HSETNX', key, field, raw) == 0 then
    return 0
  end
  body_added(tag)
  return 1
end

-- Write a packed record as is (the tick patches state and attempt in place).
local function record_put(bkey, run_id, raw)
  redis.call('HSET', bkey, body_field(run_id), raw)
end

local function record_delete(bkey, run_id)
  if redis.call('HDEL', bkey, body_field(run_id)) == 1 then
    body_removed(body_tag())
  end
end

local function record_pack(r)
  -- Trailing nils are left out (a fresh task has four: updated, error, schedule, dead):
  -- unpacking yields nil for them anyway, and 50M records save 200 MB. The queue
  -- 'default' and a created time up to 2^31 ms before due are stored short (record_expand
  -- gives them in full again): 11 bytes of a fresh task's 146.
  local n = 12
  while n > 0 and r[n] == nil do
    n = n - 1
  end
  local queue, created = r[R_QUEUE], r[R_CREATED]
  local stored = created and record_created_stored(created, r[R_DUE])
  if queue ~= 'default' and stored == created then
    return cmsgpack.pack(unpack(r, 1, n))
  end
  if queue == 'default' then
    r[R_QUEUE] = nil
  end
  r[R_CREATED] = stored
  local raw = cmsgpack.pack(unpack(r, 1, n))
  r[R_QUEUE], r[R_CREATED] = queue, created
  return raw
end

local function record_save(bkey, run_id, r, field)
  local raw = record_pack(r)
  redis.call('HSET', bkey, field or body_field(run_id), raw)
  return raw
end

-- The nils that fill the places between a record's last value and updated (field 9).
local RECORD_FILL = { [0] = '', '\192', '\192\192', '\192\192\192', '\192\192\192\192',
  '\192\192\192\192\192', '\192\192\192\192\192\192' }

-- The first two bytes of a record whose state and attempt are small (one byte each), by
-- attempt, for one state (heads: the caller's table for it).
local function record_head(heads, state, attempt)
  local head = heads and heads[attempt]
  if head == nil then
    head = string.char(state, attempt)
    if heads then
      heads[attempt] = head
    end
  end
  return head
end

-- A record whose values end at opts at most (no updated, error, schedule or dead letter:
-- a one-shot run finishing its first life) is patched rather than packed again, which
-- is what it costs most: state and attempt are its first two bytes (small integers, one
-- byte each), and updated is appended. The result is the bytes record_pack would give.
-- A record not in that form (a last byte that is a nil: one packed with its trailing nils,
-- as earlier versions did) is packed as a whole. A patched r takes the new state only.
local function record_finish(bkey, field, r, raw, state, now, now_packed, heads)
  local attempt = r[R_ATTEMPT]
  local first, second = string.byte(raw, 1, 2)
  local out
  if r[R_UPDATED] == nil and r[R_ERROR] == nil and r[R_SCHEDULE] == nil and
      r[R_DEAD] == nil and first < 128 and second < 128 and attempt >= 0 and attempt < 128 and
      string.byte(raw, -1) ~= 192 then
    local n = R_OPTS
    while r[n] == nil do
      n = n - 1
    end
    local head = heads and heads[attempt] or record_head(heads, state, attempt)
    out = head .. string.sub(raw, 3) .. RECORD_FILL[R_OPTS - n] .. now_packed
    r[R_STATE] = state
  else
    r[R_STATE], r[R_UPDATED] = state, now
    out = record_pack(r)
  end
  redis.call('HSET', bkey, field, out)
end

-- Sizes of msgpack numbers by their first byte, past the one-byte fixints (0x00-0x7f,
-- 0xe0-0xff): unsigned and signed integers of 1, 2, 4, 8 bytes, float, double.
local MP_NUMBER_SIZE = { [0xcc] = 2, [0xcd] = 3, [0xce] = 5, [0xcf] = 9, [0xd0] = 2,
  [0xd1] = 3, [0xd2] = 5, [0xd3] = 9, [0xca] = 5, [0xcb] = 9 }

-- A retry rewrites state, attempt, due, updated and error and keeps every other value: so
-- the record is patched, not packed again (a whole pack makes a string of each value and
-- joins them). State and attempt are its first two bytes (one byte each), due follows
-- (its size read from its first byte); the values from tenant to opts are copied as they
-- are (but a created time stored short, which is relative to due: record_pack), then come
-- updated and error (a nil put in for opts when the record ended before it, the record's
-- own updated and error replaced when it has them), then whatever follows (schedule, dead
-- letter) as it is. A record in another form (a longer state, attempt or due; a tenant or
-- queue name of 256 bytes or more; a created time that is not an integer; one ending in a
-- nil, which a whole pack would leave out) gives nil.
local function record_retried(raw, r, due, due_packed, now_packed, error_packed, heads)
  local c = lib_c
  local attempt = r[R_ATTEMPT]
  local byte = c.byte
  local first, second, third = byte(raw, 1, 3)
  if third == nil or first >= 128 or second >= 128 or attempt < 0 or attempt >= 128 or
      byte(raw, -1) == 192 then
    return nil
  end
  local due_size = 1
  if third >= 128 and third < 0xe0 then
    due_size = MP_NUMBER_SIZE[third]
    if due_size == nil then
      return nil
    end
  end
  -- Tenant and queue are copied as they are: from the tenant's first byte (1-based) to
  -- the created time's, past the tenant (a fixstr or str8, as long as r tells) and the
  -- queue (nil, or a string of either kind). The created time stored short (a negative
  -- integer) is packed again from the new due (in full past 2^31 ms); in full it is copied.
  local from = 3 + due_size
  local tenant_size = #r[R_TENANT]
  local at_created = from + tenant_size + 1
  if tenant_size >= 32 then
    at_created = at_created + 1
    if tenant_size >= 256 then
      return nil
    end
  end
  local b, len = byte(raw, at_created, at_created + 1)
  if b == 0xc0 then
    at_created = at_created + 1
  elseif b >= 0xa0 and b < 0xc0 then
    at_created = at_created + b - 0x9f
  elseif b == 0xd9 then
    at_created = at_created + 2 + len
  else
    return nil
  end
  -- names: tenant and queue, then the created time, when it is packed again
  local names, created_packed = '', ''
  b = byte(raw, at_created)
  if b >= 0xe0 or (b >= 0xd0 and b <= 0xd3) then
    names = c.sub(raw, from, at_created - 1)
    created_packed = c.pack(record_created_stored(r[R_CREATED], due))
    from = at_created + (MP_NUMBER_SIZE[b] or 1)
  elseif not (b < 0x80 or (b >= 0xcc and b <= 0xcf)) then
    return nil
  end
  local head = heads and heads[attempt] or record_head(heads, ST_SCHEDULED, attempt)
  -- Offsets are 0-based: past tenant, queue, created, payload and opts; -1 if the record
  -- ends there or before. A record with no value past opts (as r, unpacked from raw,
  -- tells; a run's first failure) ends there or before: nothing to look for.
  local at = -1
  if r[R_UPDATED] ~= nil or r[R_ERROR] ~= nil or r[R_SCHEDULE] ~= nil or r[R_DEAD] ~= nil then
    at = cmsgpack.unpack_limit(raw, 5, 2 + due_size)
  end
  if at < 0 then
    local n = R_OPTS
    while r[n] == nil do
      n = n - 1
    end
    if n < R_QUEUE then
      return nil
    end
    return head .. due_packed .. names .. created_packed .. c.sub(raw, from) ..
      RECORD_FILL[R_OPTS - n] .. now_packed .. error_packed
  end
  local rest = cmsgpack.unpack_limit(raw, 2, at)
  local tail = ''
  if rest >= 0 then
    tail = string.sub(raw, rest + 1)
  end
  return head .. due_packed .. names .. created_packed .. string.sub(raw, from, at) ..
    now_packed .. error_packed .. tail
end
