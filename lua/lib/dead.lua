-- Dead letters: tag..'dead:'..tenant STREAM, one entry per buried run (attempts used up,
-- a permanent failure, expired before it was sent), listed by timewheel/runs/dead_letters.py.
-- A buried run's record says dead and holds its entry id (R_DEAD). Calls lib/record.lua.
--
--   dead_letter(tag, run_id, r, reason, err, now) -> entry id   add the run's dead
--       letter, from its record r as it stands (queue, attempt, due, payload).
--   dead_take(tag, dead_key, run_id, tenant) -> r, bkey   a tenant's dead-lettered run
--       taken back (replay, purge): its dead letter is deleted from dead_key and its record
--       and body hash key returned; nil if the tenant has no dead-lettered run of this id.

local function dead_letter(tag, run_id, r, reason, err, now)
  local tenant = r[R_TENANT]
  return redis.call('XADD', tag .. 'dead:' .. tenant, '*', 'run_id', run_id,
    'tenant', tenant, 'queue', r[R_QUEUE], 'attempt', r[R_ATTEMPT], 'reason', reason,
    'error', err, 'dead_ms', now, 'due_ms', r[R_DUE], 'payload', r[R_PAYLOAD])
end

local function dead_take(tag, dead_key, run_id, tenant)
  local bkey = body_key(tag, run_id)
  local r = record_owned(bkey, run_id, tenant)
  if r == nil or r[R_STATE] ~= ST_DEAD then
    return nil
  end
  if r[R_DEAD] then
    redis.call('XDEL', dead_key, r[R_DEAD])
  end
  return r, bkey
end
