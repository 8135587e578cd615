--[[ audit_near: check tenants' near levels of one shard, one bounded step of members at a
  time (read only; docs/operations/auditing.md).
  KEYS[1 ..] near  ZSET tag..'near:'..tenant, run id -> due ms, each of the same shard (the
                   tag is KEYS[1] up to '}:'), read in order
  ARGV[1] ZSCAN cursor in KEYS[1] ('0' = from its start, which checks the due index too)
  ARGV[2] limit: members per call (<= 500; a listpack-encoded level answers whole)
  ARGV[3] now_ms override ('' = TIME)   ARGV[4] bucket_ms
  ARGV[5 ..] per key of KEYS, the scheduled runs audit_records found in it: a level that
          holds exactly as many members is accounted for and not read member by member
  Derived keys (same tag): meta, due, rates, tokens, t:<xy>, w:<bucket>.
  Returns: {done, cursor, read, counted, findings...}   done: how many of KEYS were read to
           their end; cursor: where to go on in KEYS[done + 1]; read: members read one by
           one; counted: members accounted for by their number; findings 6 values each, as
           audit_records.
  Errors:  none.
  Checks: every member has a record (record_missing) that says scheduled
  (wheel_member_stale), is this tenant's and scored at its due time (wheel_misplaced), and
  is not in a far bucket too (wheel_duplicate: it would be sent twice); the
  tenant is in the due index no later than its earliest run (of the first 10 members, the
  earliest that is sound) unless its dispatch_rate holds it back (due_index: the tick
  serves only the tenants that index lists). ]]
local rcall = redis.call
local cursor, limit, now_override = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local bucket_ms = tonumber(ARGV[4])
local expected = { unpack(ARGV, 5) }
local tag = string.match(KEYS[1], '^(.-}:)')

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/rate.lua
--!include lib/audit.lua

local out = { 0, '0', 0, 0 }
local EARLIEST_LOOKED_AT = 10

-- The earliest of a level's first members that is a sound scheduled run of the tenant
-- (a stale or misplaced member is reported as such, and the tick skips it).
local function earliest_run(near_key, tenant)
  local first = rcall('ZRANGE', near_key, 0, EARLIEST_LOOKED_AT - 1, 'WITHSCORES')
  for i = 1, #first, 2 do
    local at = tonumber(first[i + 1])
    local r = audit_read(tag, first[i], true)
    if r and r[R_STATE] == ST_SCHEDULED and r[R_TENANT] == tenant and r[R_DUE] == at then
      return first[i], at
    end
  end
  return nil
end

local function check_due_index(near_key, tenant)
  local run_id, at = earliest_run(near_key, tenant)
  if run_id == nil then
    return
  end
  local entry = tonumber(rcall('ZSCORE', tag .. 'due', tenant))
  if entry == nil then
    audit_add(out, 'due_index', tenant, run_id, '', 'near:' .. tenant .. ' holds runs but'
      .. ' the tenant is not in the due index: the tick never serves them')
  elseif entry > at then
    local rate = rate_buckets(tag, { tenant }, clock_shard_ms(tag .. 'meta', now_override))
    if not rate[tenant] then
      audit_add(out, 'due_index', tenant, run_id, '', string.format(
        'the due index says %d, later than the earliest run (%d)', entry, at))
    end
  end
end

local function check_member(tenant, run_id, score)
  local r, raw = audit_read(tag, run_id, true)
  if raw == nil then
    audit_add(out, 'record_missing', tenant, run_id, '', 'in near:' .. tenant
      .. ' but it has no record')
  elseif r == nil then
    return  -- does not decode: audit_records reports it
  elseif r[R_STATE] ~= ST_SCHEDULED then
    audit_add(out, 'wheel_member_stale', tenant, run_id, '', string.format(
      'in near:%s but its record says state %d', tenant, r[R_STATE]))
  elseif r[R_TENANT] ~= tenant then
    audit_add(out, 'wheel_misplaced', tenant, run_id, '', 'in near:' .. tenant
      .. ' but it is a run of tenant ' .. r[R_TENANT])
  elseif score ~= r[R_DUE] then
    audit_add(out, 'wheel_misplaced', tenant, run_id, '', string.format(
      'scored %d in near:%s but due %d', score, tenant, r[R_DUE]))
  else
    local key = wheel_far_or_distant(tag, wheel_member(run_id), r[R_DUE], bucket_ms)
    if key then
      audit_add(out, 'wheel_duplicate', tenant, run_id, '', 'in near:' .. tenant
        .. ' and in the far bucket ' .. string.sub(key, #tag + 1)
        .. ': it would be sent twice')
    end
  end
end

local done, read, counted = 0, 0, 0
while done < #KEYS and read < limit do
  local near_key = KEYS[done + 1]
  local tenant = string.sub(near_key, #tag + 6)
  local whole = false
  if cursor == '0' then
    check_due_index(near_key, tenant)
    local size = rcall('ZCARD', near_key)
    if size == tonumber(expected[done + 1]) then
      whole, counted = true, counted + size
    end
  end
  if whole then
    done = done + 1
  else
    local reply = rcall('ZSCAN', near_key, cursor, 'COUNT', limit - read)
    local flat = reply[2]
    for i = 1, #flat, 2 do
      check_member(tenant, flat[i], tonumber(flat[i + 1]))
    end
    read = read + #flat / 2
    cursor = reply[1]
    if cursor == '0' then
      done = done + 1
    end
  end
end
out[1], out[2], out[3], out[4] = done, cursor, read, counted
return out
