-- Body hashes that split (docs/design.md, "Body hashes that split"): where a run's record
-- lives in its shard. A shard's records spread over body hashes chosen by the low bits of
-- the task id's token (its last four characters, 20 bits) by linear hashing: the shard's
-- meta holds body_bits (L), body_split (s) and body_n (records in the shard). A task whose
-- low L bits v are at least s is in hash (L, v); below s its hash has split, and it is in
-- (L + 1, its low L + 1 bits). Once the shard holds more than BODY_K.LOAD records per hash,
-- hash (L, s) splits into (L + 1, s) and (L + 1, s + 2^L) and s moves on (L + 1 and s = 0
-- once every hash of level L has split). So the hashes grow with what the shard holds:
-- one hash for a few records, 12,000 for 780,000, each about BODY_K.LOAD records, a short
-- listpack; a lookup is one HGET whatever the size.
--
-- Names: level 10 is 't:<xy>' (xy: the two characters of the 10 bits), the 1,024 hashes
-- every shard had before hashes split; any other level is 't<level>:<chars>', the bits in
-- ceil(level / 5) characters of the id alphabet ('t0:', 't3:5', 't13:1gy'). A record's
-- field is the run id less its 3 shard characters and the last floor(level / 5)
-- characters of the task id, which the name implies.
--
-- A shard whose meta has no body_bits is read as level 10, split 0: the layout of earlier
-- versions, or a shard that holds nothing yet. Once its meta says grow = 1 (no older
-- release writes to the deployment: timewheel/store/deployment.py; lib/wheel.lua's
-- distant buckets wait for it too), the first record
-- created settles it (body_settle): level 0 if no 't:<xy>' hash exists, else level 10
-- with the count taken; until then it keeps level 10 and never splits.
--
-- The layout is read once per call (every call touches one shard) and kept in BODY; the
-- library calls body_forget() at the start of every call, so nothing outlives a call.
--
--   body_forget()   drop what the last call read (and bind lib_c, below, at the first call).
--   body_locate(tag, run_id) -> task_id, bkey, field   where a run's record lives.
--   body_field(run_id) -> field   its field, in the shard body_locate last read.
--   body_tag() -> tag   that shard's tag.
--   body_added(tag)   count a record just written; body_removed(tag)   one deleted. The
--       counts of a call go to body_n at its end, in one HINCRBY (body_flush).
--   body_flush()   add the call's count to body_n and, past the load, split the next
--       hashes (at most one per record added); the library calls it at the end of every
--       call (after the reply is made: a split moves records, so nothing of the call may
--       hold a body key after it).
--   body_settle(tag)   give a shard with no body_bits its layout, once it may grow (above).
--   body_at(tag, position) -> bkey, dropped, next_position   the body hash holding the
--       position (0 .. 2^20 - 1) of the walk, the characters its fields leave out, and the
--       position the next hash starts at (2^20: the last). The walk visits the hashes in
--       the order of their bits read backwards, which a split does not change: a hash's
--       children take its place, so a cursor between two hashes stays good.
--   body_run_id(shard_chars, dropped, field) -> run_id   a field's run id.
--   body_layout(tag) -> BODY   the shard's layout, read once per call;
--   body_meta(tag, field, ...) -> values   the layout and other fields of the shard's meta
--       in one HMGET (a call that reads meta anyway: run_ack, run_fail);
--   body_hash(b, x) -> level, v   the hash holding low bits x;
--   body_name(level, v) -> name;  body_low_bits(task_id) -> x;  body_reverse(x) -> x'
--   (bits 0 .. 19 backwards);  body_split(tag)   split the next hash (body_flush).

-- C functions that the per-run paths call (body_locate, delivery_loader, record_retried,
-- retry_or_bury), kept in one table of the library (one local: a chunk holds at most
-- 200): reading one as a global's field (string.sub, redis.call) costs some 200
-- instructions more, a few times per run. A library being loaded cannot reach string,
-- cmsgpack or redis.call, so they are bound at the first call's start (body_forget, which
-- the library runs first in every call, calls lib_c.bind while lib_c.call is nil).
-- Binding also sets the functions' Lua collector to a pause of 1000 %, once per library
-- load (docs/design.md, the Function library).
local lib_c = {}

function lib_c.bind()
  lib_c.sub, lib_c.byte, lib_c.format = string.sub, string.byte, string.format
  lib_c.find = string.find
  lib_c.pack, lib_c.unpack, lib_c.call = cmsgpack.pack, cmsgpack.unpack, redis.call
  collectgarbage('setpause', 1000)
end

-- Constants, in one table (a library's chunk holds at most 200 locals): records per hash
-- before the next split; 2^20 hashes at most (four characters of the token); the level
-- of a shard with no body_bits ('t:<xy>', 1,024 hashes); 2^20 walk positions; and as
-- literal tables (a library loads without the string and math modules) the id
-- alphabet's values by byte, its characters by value, and powers of two.
local BODY_K = {
  LOAD = 64, MAX_BITS = 20, LEGACY_BITS = 10, WALK = 1048576,
  -- floor(level / 5): the characters of the task id a level's hash names leave out
  DROP = {
    [0] = 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 4, 4
  },
  VALUE = {
    [48] = 0, [49] = 1, [50] = 2, [51] = 3, [52] = 4, [53] = 5, [54] = 6, [55] = 7, [56] = 8,
    [57] = 9, [97] = 10, [98] = 11, [99] = 12, [100] = 13, [101] = 14, [102] = 15,
    [103] = 16, [104] = 17, [106] = 18, [107] = 19, [109] = 20, [110] = 21, [112] = 22,
    [113] = 23, [114] = 24, [115] = 25, [116] = 26, [118] = 27, [119] = 28, [120] = 29,
    [121] = 30, [122] = 31
  },
  CHAR = {
    [0] = '0', [1] = '1', [2] = '2', [3] = '3', [4] = '4', [5] = '5', [6] = '6', [7] = '7',
    [8] = '8', [9] = '9', [10] = 'a', [11] = 'b', [12] = 'c', [13] = 'd', [14] = 'e',
    [15] = 'f', [16] = 'g', [17] = 'h', [18] = 'j', [19] = 'k', [20] = 'm', [21] = 'n',
    [22] = 'p', [23] = 'q', [24] = 'r', [25] = 's', [26] = 't', [27] = 'v', [28] = 'w',
    [29] = 'x', [30] = 'y', [31] = 'z'
  },
  POW = {
    [0] = 1, [1] = 2, [2] = 4, [3] = 8, [4] = 16, [5] = 32, [6] = 64, [7] = 128, [8] = 256,
    [9] = 512, [10] = 1024, [11] = 2048, [12] = 4096, [13] = 8192, [14] = 16384,
    [15] = 32768, [16] = 65536, [17] = 131072, [18] = 262144, [19] = 524288, [20] = 1048576,
    [21] = 2097152
  },
}

local BODY = { tag = false, bits = BODY_K.LEGACY_BITS, split = 0, settled = false, grow = false,
  keys = {}, added = 0 }

local function body_forget()
  BODY.tag, BODY.added = false, 0
  if lib_c.call == nil then
    lib_c.bind()
  end
end

-- m: meta's body_bits, body_split and grow when the caller read them (body_meta).
local function body_layout(tag, m)
  if BODY.tag ~= tag or m then
    m = m or redis.call('HMGET', tag .. 'meta', 'body_bits', 'body_split', 'grow')
    BODY.tag, BODY.keys = tag, {}
    BODY.bits, BODY.split = tonumber(m[1]) or BODY_K.LEGACY_BITS, tonumber(m[2]) or 0
    BODY.settled, BODY.grow = m[1] ~= false, m[3] == '1'
  end
  return BODY
end

local function body_meta(tag, ...)
  local m = redis.call('HMGET', tag .. 'meta', 'body_bits', 'body_split', 'grow', ...)
  body_layout(tag, m)
  return { unpack(m, 4) }
end

local function body_tag()
  if not BODY.tag then
    error('ERR body layout not read in this call')
  end
  return BODY.tag
end

-- The name of hash (level, v) after the tag.
local function body_name(level, v)
  local n = math.ceil(level / 5)
  local chars = {}
  for i = n, 1, -1 do
    chars[i] = BODY_K.CHAR[v % 32]
    v = math.floor(v / 32)
  end
  if level == BODY_K.LEGACY_BITS then
    return 't:' .. table.concat(chars)
  end
  return 't' .. level .. ':' .. table.concat(chars)
end

-- The token's low 20 bits: its last four characters (anything off the alphabet reads 0,
-- so a malformed id finds no record rather than failing the call).
local function body_low_bits(task_id)
  local n = #task_id
  local a, b, c, d = lib_c.byte(task_id, n - 3, n)
  local V = BODY_K.VALUE
  return (((V[a] or 0) * 32 + (V[b] or 0)) * 32 + (V[c] or 0)) * 32 + (V[d] or 0)
end

-- The hash (level, v) that holds low bits x in layout b.
local function body_hash(b, x)
  local level = b.bits
  local v = x % BODY_K.POW[level]
  if v < b.split then
    level = level + 1
    v = x % BODY_K.POW[level]
  end
  return level, v
end

-- body_locate runs once per run of every call (tick, acks, fails, creates): the C
-- functions it calls come from lib_c, and it looks for a schedule run's '@' only past a
-- task id's 16 characters.
local function body_locate(tag, run_id)
  local b = BODY
  if b.tag ~= tag then
    b = body_layout(tag)
  end
  local C = lib_c
  local n, at = #run_id, nil
  if n > 16 then
    at = C.find(run_id, '@', 1, true)
    if at then
      n = at - 1
    end
  end
  local task_id = at and C.sub(run_id, 1, n) or run_id
  local level, v = body_hash(b, body_low_bits(task_id))
  local slot = level * 2097152 + v
  local key = b.keys[slot]
  if key == nil then
    key = tag .. body_name(level, v)
    b.keys[slot] = key
  end
  local last = n - BODY_K.DROP[level]
  if at then
    return task_id, key, C.sub(run_id, 4, last) .. C.sub(run_id, at)
  end
  return task_id, key, C.sub(run_id, 4, last)
end

local function body_field(run_id)
  local _, _, field = body_locate(body_tag(), run_id)
  return field
end

local function body_run_id(shard_chars, dropped, field)
  local at = string.find(field, '@', 1, true)
  if at then
    return shard_chars .. string.sub(field, 1, at - 1) .. dropped .. string.sub(field, at)
  end
  return shard_chars .. field .. dropped
end

local function body_settle(tag)
  local b = body_layout(tag)
  if b.settled or not b.grow then
    return
  end
  local names = {}
  for i = 0, 1023 do
    names[i + 1] = tag .. 't:' .. BODY_K.CHAR[math.floor(i / 32)] .. BODY_K.CHAR[i % 32]
  end
  local bits, n = 0, 0
  if redis.call('EXISTS', unpack(names)) > 0 then
    bits = BODY_K.LEGACY_BITS
    for i = 1, 1024 do
      n = n + redis.call('HLEN', names[i])
    end
  end
  redis.call('HSET', tag .. 'meta', 'body_bits', bits, 'body_split', 0, 'body_n', n)
  b.bits, b.split, b.settled, b.keys = bits, 0, true, {}
end

-- Split hash (bits, split): its records go to its two children by the next bit. Where
-- the two levels leave out as many characters (four splits in five), the hash is renamed
-- to its first child and only the records of the second move (HKEYS, then HMGET, HSET
-- and HDEL of those); else every record is written again with its shorter field.
local function body_split(tag)
  local b = BODY
  local level, v = b.bits, b.split
  local from = tag .. body_name(level, v)
  local keep = math.floor(level / 5)
  local dropped = keep > 0 and string.sub(from, -keep) or ''
  if v + 1 == BODY_K.POW[level] then
    b.bits, b.split = level + 1, 0
  else
    b.split = v + 1
  end
  b.keys = {}
  redis.call('HSET', tag .. 'meta', 'body_bits', b.bits, 'body_split', b.split)
  if keep ~= math.floor((level + 1) / 5) then
    local flat = redis.call('HGETALL', from)
    if #flat == 0 then
      return
    end
    redis.call('DEL', from)
    local into = {}
    for i = 1, #flat, 2 do
      -- '000' stands for the shard characters, which placement does not read.
      local _, key, field = body_locate(tag, body_run_id('000', dropped, flat[i]))
      local args = into[key]
      if args == nil then
        args = { key }
        into[key] = args
      end
      args[#args + 1] = field
      args[#args + 1] = flat[i + 1]
      if #args > 400 then
        redis.call('HSET', unpack(args))
        into[key] = nil
      end
    end
    for _, args in pairs(into) do
      redis.call('HSET', unpack(args))
    end
    return
  end
  local fields = redis.call('HKEYS', from)
  if #fields == 0 then
    return
  end
  local low = tag .. body_name(level + 1, v)
  redis.call('RENAME', from, low)
  local high = tag .. body_name(level + 1, v + BODY_K.POW[level])
  local bit, moving = BODY_K.POW[level], {}
  for i = 1, #fields do
    local field = fields[i]
    local at = string.find(field, '@', 1, true)
    local task = (at and string.sub(field, 1, at - 1) or field) .. dropped
    if math.floor(body_low_bits(task) / bit) % 2 == 1 then
      moving[#moving + 1] = field
    end
  end
  for i = 1, #moving, 200 do
    local part = { unpack(moving, i, math.min(i + 199, #moving)) }
    local raws = redis.call('HMGET', low, unpack(part))
    local args = { high }
    for j = 1, #part do
      args[2 * j], args[2 * j + 1] = part[j], raws[j]
    end
    redis.call('HSET', unpack(args))
    redis.call('HDEL', low, unpack(part))
  end
end

local function body_added(tag)
  if body_layout(tag).settled then
    BODY.added = BODY.added + 1
  end
end

local function body_removed(tag)
  if body_layout(tag).settled then
    BODY.added = BODY.added - 1
  end
end

local function body_flush()
  local b = BODY
  local added = b.added
  if added == 0 or not b.tag then
    return
  end
  b.added = 0
  local n = redis.call('HINCRBY', b.tag .. 'meta', 'body_n', added)
  -- At most one split per record the call added: a shard far past its load (one that
  -- an earlier release filled, settled at level 10) grows a little with every create
  -- instead of splitting thousands of hashes in one call.
  while added > 0 and b.bits < BODY_K.MAX_BITS and n > BODY_K.LOAD * (BODY_K.POW[b.bits] + b.split) do
    body_split(b.tag)
    added = added - 1
  end
end

-- Bits 0 .. 19 of x in reverse order.
local function body_reverse(x)
  local r = 0
  for _ = 1, 20 do
    r = r * 2 + x % 2
    x = math.floor(x / 2)
  end
  return r
end

local function body_at(tag, position)
  local b = body_layout(tag)
  local level, v = body_hash(b, body_reverse(position))
  local name = body_name(level, v)
  local keep = math.floor(level / 5)
  local dropped = keep > 0 and string.sub(name, -keep) or ''
  -- The hash holds the positions that share its level's bits: a run of 2^(20 - level)
  -- from the first of them.
  local span = BODY_K.POW[BODY_K.MAX_BITS - level]
  return tag .. name, dropped, position - position % span + span
end
