--[[ audit_far: check far and distant buckets of one shard, one bounded step of members at a
  time (read only; docs/operations/auditing.md).
  KEYS[1 ..] bucket  HASH tag..'w:'..start (or a child, tag..'w:'..start..':'..<hex>), or a
                     distant bucket tag..'wd:'..start (or a child), member -> '', each of
                     the same shard (the tag is KEYS[1] up to '}:'), read in order
  ARGV[1] HSCAN cursor in KEYS[1] ('0' = from its start)   ARGV[2] limit: members per call
          (<= 500; a listpack-encoded bucket answers whole, up to 1,024)   ARGV[3] bucket_ms
  ARGV[4 ..] per key of KEYS, the scheduled runs audit_records found in it: an indexed
          bucket that holds exactly as many members is accounted for and not read member by
          member
  Derived keys (same tag): meta, wheel, distant, the body hashes.
  Returns: {done, cursor, read, counted, findings...}   done: how many of KEYS were read to
           their end; cursor: where to go on in KEYS[done + 1]; read: members read one by
           one; counted: members accounted for by their number; findings 6 values each, as
           audit_records.
  Errors:  none.
  Checks: every member has a record (record_missing) that says scheduled
  (wheel_member_stale), due within its bucket, not before promoted_until and in a bucket
  of its path (wheel_misplaced: the tick never reads far buckets, a cancel reads the
  path); the bucket is in its index (wheel, or distant for a distant bucket), which the
  promoter reads (not_in_wheel for each of its runs otherwise). ]]
local rcall = redis.call
local cursor, limit, bucket_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local expected = { unpack(ARGV, 4) }
local tag = string.match(KEYS[1], '^(.-}:)')

--!include lib/record.lua
--!include lib/wheel.lua
--!include lib/audit.lua

local out = { 0, '0', 0, 0 }
local promoted = wheel_promoted_until(tag .. 'meta')

-- Whether bucket `name` (a bucket start, or a child of one) is on the member's path.
local function on_path(name, start, member)
  if name == start then
    return true
  end
  for _, n in ipairs(wheel_path(start, member)) do
    if n == name then
      return true
    end
  end
  return false
end

local function check_member(prefix, name, indexed, run_id)
  local start = wheel_bucket_start(name)
  local due_start = audit_bucket  -- the start of the bucket a due time names
  if prefix == 'wd:' then
    due_start = wheel_distant_start
  end
  local r, raw = audit_read(tag, run_id, true)
  if raw == nil then
    audit_add(out, 'record_missing', '', run_id, '', 'in the far bucket ' .. prefix .. name
      .. ' but it has no record')
    return
  elseif r == nil then
    return  -- does not decode: audit_records reports it
  end
  local tenant, due = r[R_TENANT], r[R_DUE]
  if r[R_STATE] ~= ST_SCHEDULED then
    audit_add(out, 'wheel_member_stale', tenant, run_id, '', string.format(
      'in the far bucket %s%s but its record says state %d', prefix, name, r[R_STATE]))
  elseif due_start(due, bucket_ms) ~= start then
    audit_add(out, 'wheel_misplaced', tenant, run_id, '', string.format(
      'in the far bucket %s%s but due %d, in %s%s', prefix, name, due, prefix,
      due_start(due, bucket_ms)))
  elseif due < promoted then
    audit_add(out, 'wheel_misplaced', tenant, run_id, '', string.format(
      'in the far bucket %s%s but due %d, before promoted_until %d', prefix, name, due,
      promoted))
  elseif not on_path(name, start, wheel_member(run_id)) then
    audit_add(out, 'wheel_misplaced', tenant, run_id, '', 'in the far bucket ' .. prefix
      .. name .. ', which is not on its path (lib/wheel.lua): a cancel would not find it')
  elseif not indexed then
    audit_add(out, 'not_in_wheel', tenant, run_id, '', 'its far bucket ' .. prefix .. name
      .. ' is not in its index: the promoter never moves it',
      string.format('%d', r[R_ATTEMPT]))
  end
end

local done, read, counted = 0, 0, 0
while done < #KEYS and read < limit do
  local bucket_key = KEYS[done + 1]
  local prefix, index = 'w:', 'wheel'
  if string.sub(bucket_key, #tag + 1, #tag + 3) == 'wd:' then
    prefix, index = 'wd:', 'distant'
  end
  local name = string.sub(bucket_key, #tag + #prefix + 1)
  local indexed = rcall('ZSCORE', tag .. index, name) ~= false
  local whole = false
  if cursor == '0' and indexed then
    local size = rcall('HLEN', bucket_key)
    if size == tonumber(expected[done + 1]) then
      whole, counted = true, counted + size
    end
  end
  if whole then
    done = done + 1
  else
    local next_cursor, flat = audit_scan(bucket_key, cursor, limit - read)
    for i = 1, #flat, 2 do
      check_member(prefix, name, indexed, wheel_run_id(tag, flat[i]))
    end
    read = read + #flat / 2
    cursor = next_cursor
    if cursor == '0' then
      done = done + 1
    end
  end
end
out[1], out[2], out[3], out[4] = done, cursor, read, counted
return out
