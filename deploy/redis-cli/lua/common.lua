-- Helpers of the deploy/redis-cli snippets. lib/common.bash sends this file ahead of a
-- snippet, under '#!lua flags=no-writes': Redis refuses any write from them. A snippet
-- answers {'ok', line, ...}; lines are space-separated fields, '-' for none.
-- Key layout and record format: docs/design.md ("Redis key layout").

-- The tag of a key of one shard ('{tw:3}:') and the shard's number.
local function tw_tag(key)
  return string.match(key, '^({.-:%d+}:)')
end

local function tw_shard(tag)
  return tonumber(string.match(tag, ':(%d+)}:$'))
end

-- Redis's clock in epoch ms, held at the shard's high-water mark as the tick holds it.
local function tw_now(tag)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local hwm = tonumber(redis.call('HGET', tag .. 'meta', 'hwm')) or 0
  return math.max(now, hwm)
end

-- Epoch ms as UTC ISO 8601 with milliseconds; '-' for none.
local function tw_iso(ms)
  ms = tonumber(ms)
  if ms == nil then
    return '-'
  end
  local s = math.floor(ms / 1000)
  local frac = ms - s * 1000
  local days = math.floor(s / 86400)
  local rem = s - days * 86400
  -- civil date from days since 1970-01-01 (proleptic Gregorian)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400 + (month <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', year, month, day,
    math.floor(rem / 3600), math.floor(rem % 3600 / 60), rem % 60, frac)
end

-- A number as an integer field; '-' for none.
local function tw_int(v)
  v = tonumber(v)
  if v == nil then
    return '-'
  end
  return string.format('%d', v)
end

-- A text value on one line: control characters escaped; '-' for none or empty.
local function tw_text(v)
  if v == nil or v == false or v == '' then
    return '-'
  end
  return (string.gsub(tostring(v), '%c', function(c)
    return string.format('\\x%02x', string.byte(c))
  end))
end

-- Where a run's record lives (lua/lib/bodies.lua body_locate): body hash key and field.
-- The shard's meta holds its body layout: level L (body_bits; none: 10) and split s; a
-- task whose token's low L bits v are below s is in level L + 1. Level 10 is 't:<xy>',
-- another 't<level>:<chars>'; the field leaves out the last floor(level / 5) characters.
local TW_ALPHABET = '0123456789abcdefghjkmnpqrstvwxyz'
local function tw_body(tag, run_id)
  local task_id, rest = string.match(run_id, '^([^@]+)(.*)$')
  local m = redis.call('HMGET', tag .. 'meta', 'body_bits', 'body_split')
  local level, split = tonumber(m[1]) or 10, tonumber(m[2]) or 0
  local x = 0
  for i = #task_id - 3, #task_id do
    x = x * 32 + ((string.find(TW_ALPHABET, string.sub(task_id, i, i), 1, true) or 1) - 1)
  end
  local v = x % 2 ^ level
  if v < split then
    level = level + 1
    v = x % 2 ^ level
  end
  local chars = ''
  for _ = 1, math.ceil(level / 5) do
    chars = string.sub(TW_ALPHABET, v % 32 + 1, v % 32 + 1) .. chars
    v = math.floor(v / 32)
  end
  local name = level == 10 and 't:' .. chars or 't' .. level .. ':' .. chars
  return tag .. name, string.sub(task_id, 4, #task_id - math.floor(level / 5)) .. rest
end

-- Record field positions and state names (lua/lib/record.lua, timewheel/types.py).
local R_STATE, R_ATTEMPT, R_DUE, R_TENANT, R_QUEUE, R_CREATED = 1, 2, 3, 4, 5, 6
local R_PAYLOAD, R_OPTS, R_UPDATED, R_ERROR, R_SCHEDULE, R_DEAD = 7, 8, 9, 10, 11, 12
local TW_STATES = { [0] = 'scheduled', 'dispatched', 'succeeded', 'cancelled', 'dead',
  'skipped' }

-- A run's record as stored (its msgpack values in a table), or nil; what it stores short
-- is given in full (lua/lib/record.lua record_expand): a nil queue is 'default', a
-- negative created time is relative to due.
local function tw_record(tag, run_id)
  local bkey, field = tw_body(tag, run_id)
  local raw = redis.call('HGET', bkey, field)
  if not raw then
    return nil
  end
  local r = { cmsgpack.unpack(raw) }
  if r[R_QUEUE] == nil then
    r[R_QUEUE] = 'default'
  end
  if type(r[R_CREATED]) == 'number' and r[R_CREATED] < 0 then
    r[R_CREATED] = r[R_DUE] + r[R_CREATED]
  end
  return r
end

-- Whether a run stored as scheduled has been sent (lua/lib/record.lua record_sent): due
-- before the shard's promoted_until, out of its tenant's near level, not held back by
-- its schedule.
local function tw_sent(tag, run_id, r)
  local promoted = tonumber(redis.call('HGET', tag .. 'meta', 'promoted_until')) or 0
  if r[R_DUE] >= promoted or redis.call('ZSCORE', tag .. 'near:' .. r[R_TENANT], run_id) then
    return false
  end
  return not (r[R_SCHEDULE] and redis.call('HGET', tag .. 's:' .. r[R_SCHEDULE], 'held') == run_id)
end

-- The far bucket of start `bucket` that holds `member`: the bucket, or a child a full
-- bucket split into ('<start>:' and 1-3 hex digits of the member's SHA-1, lua/lib/wheel.lua);
-- its name, or nil.
local function tw_far(tag, bucket, member)
  if redis.call('HEXISTS', tag .. 'w:' .. bucket, member) == 1 then
    return bucket
  end
  local h = redis.sha1hex(member)
  for level = 1, 3 do
    local name = bucket .. ':' .. string.sub(h, 1, level)
    if redis.call('HEXISTS', tag .. 'w:' .. name, member) == 1 then
      return name
    end
  end
  return nil
end

-- A far bucket's runs due by `now` and the earliest due time among them, read from their
-- records; nil for a bucket of more than `most` runs (those are not read).
local function tw_bucket_due(tag, name, now, most)
  local bkey = tag .. 'w:' .. name
  if redis.call('HLEN', bkey) > most then
    return nil
  end
  local prefix = string.format('%03x', tw_shard(tag))
  local fields = redis.call('HKEYS', bkey)
  local due, earliest = 0, nil
  for _, member in ipairs(fields) do
    local r = tw_record(tag, prefix .. member)
    if r then
      if r[R_DUE] <= now then
        due = due + 1
      end
      if earliest == nil or r[R_DUE] < earliest then
        earliest = r[R_DUE]
      end
    end
  end
  return due, earliest
end

-- One line of space-separated fields.
local function tw_line(...)
  return table.concat({ ... }, ' ')
end
