-- One shard's wheel. KEYS[1] the shard's meta; ARGV[1] bucket_ms; ARGV[2] most far
-- buckets to list.
-- Answers, one line each:
--   'shard <n> <tag>'   'now <iso> <ms>'   'hwm|promoted_until <iso> <ms>'
--   'epoch <n>'   'lease <node> <epoch> <ttl ms>' (or 'lease - - -')
--   'near <tenants> <runs> <due>'
--   'tenant <tenant> <runs> <due> <earliest iso> <due index iso> <rate> <tokens>', per
--       tenant of the due index (its score: the earliest due, or the next token's time
--       while dispatch_rate holds the tenant back); rate and tokens from the rates and
--       tokens hashes ('-' for a tenant without dispatch_rate)
--   'distant <buckets> <runs>'   the distant buckets (lua/lib/wheel.lua)
--   'far <buckets> <runs>'
--   'bucket <name> <start iso> <runs> <earliest due iso>', oldest first, at most
--       ARGV[2] of them; the name is the start ms, or '<start ms>:<hex>' for a child of a
--       full bucket (lua/lib/wheel.lua); the earliest due read from the records of a
--       bucket of at most 1,024 runs, else '-')
local tag = tw_tag(KEYS[1])
local most = tonumber(ARGV[2])
local now = tw_now(tag)
local meta = redis.call('HMGET', tag .. 'meta', 'hwm', 'promoted_until', 'epoch')
local out = { 'ok', tw_line('shard', tw_int(tw_shard(tag)), tag), tw_line('now', tw_iso(now),
  tw_int(now)), tw_line('hwm', tw_iso(meta[1]), tw_int(meta[1])),
  tw_line('promoted_until', tw_iso(meta[2]), tw_int(meta[2])), tw_line('epoch', tw_int(meta[3])) }

local lease = redis.call('GET', tag .. 'lease')
if lease then
  local node, epoch = string.match(lease, '^(.*)/(%d+)$')
  out[#out + 1] = tw_line('lease', tw_text(node), tw_int(epoch),
    tw_int(redis.call('PTTL', tag .. 'lease')))
else
  out[#out + 1] = 'lease - - -'
end

local tenants = redis.call('ZRANGE', tag .. 'due', 0, -1, 'WITHSCORES')
local lines, runs, due = {}, 0, 0
for i = 1, #tenants, 2 do
  local tenant, key = tenants[i], tag .. 'near:' .. tenants[i]
  local n, d = redis.call('ZCARD', key), redis.call('ZCOUNT', key, '-inf', now)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local rate = redis.call('HGET', tag .. 'rates', tenant)
  local tokens = redis.call('HGET', tag .. 'tokens', tenant)
  runs, due = runs + n, due + d
  lines[#lines + 1] = tw_line('tenant', tenant, tw_int(n), tw_int(d), tw_iso(first[2]),
    tw_iso(tenants[i + 1]), tw_text(rate), tw_text(tokens and string.match(tokens, '^([^:]*)')))
end
out[#out + 1] = tw_line('near', tw_int(#tenants / 2), tw_int(runs), tw_int(due))
for _, line in ipairs(lines) do
  out[#out + 1] = line
end

local distant, distant_runs = redis.call('ZRANGE', tag .. 'distant', 0, -1), 0
for _, name in ipairs(distant) do
  distant_runs = distant_runs + redis.call('HLEN', tag .. 'wd:' .. name)
end
out[#out + 1] = tw_line('distant', tw_int(#distant), tw_int(distant_runs))

local buckets = redis.call('ZRANGE', tag .. 'wheel', 0, -1, 'WITHSCORES')
lines, runs = {}, 0
for j = 1, #buckets, 2 do
  local name, start = buckets[j], buckets[j + 1]
  local n = redis.call('HLEN', tag .. 'w:' .. name)
  runs = runs + n
  if (j + 1) / 2 <= most then
    local _, earliest = tw_bucket_due(tag, name, now, 1024)
    lines[#lines + 1] = tw_line('bucket', name, tw_iso(start), tw_int(n), tw_iso(earliest))
  end
end
out[#out + 1] = tw_line('far', tw_int(#buckets / 2), tw_int(runs))
for _, line in ipairs(lines) do
  out[#out + 1] = line
end
return out
