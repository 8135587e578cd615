-- Ready streams of one shard, their consumer groups and pending entries. KEYS the
-- streams (q:<tenant>:<queue> keys of one shard); ARGV[1] most pending entries to list
-- per group; ARGV[2] most pending entries to read per group (the longest idle of those
-- are listed).
-- Answers, one line each:
--   'stream <shard> <queue> <length> <groups>'
--   'group <shard> <queue> <group> <consumers> <pending> <lag>'   lag: entries not yet
--       delivered to the group (counted from its last delivered id when Redis cannot say)
--   'pending <shard> <queue> <group> <consumer> <entry id> <idle ms> <deliveries> <run id>'
--       longest idle first
local most, read = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = { 'ok' }

local function field(reply, name)
  for i = 1, #reply, 2 do
    if reply[i] == name then
      return reply[i + 1]
    end
  end
  return nil
end

for _, key in ipairs(KEYS) do
  local tag = tw_tag(key)
  local shard = tw_int(tw_shard(tag))
  local queue = string.match(key, ':q:[^:]+:(.*)$')
  local length = redis.call('XLEN', key)
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', key)
  if not ok then
    groups = {}
  end
  out[#out + 1] = tw_line('stream', shard, queue, tw_int(length), tw_int(#groups))
  for _, g in ipairs(groups) do
    local name = field(g, 'name')
    local lag = field(g, 'lag')
    if not lag then
      lag = #redis.call('XRANGE', key, '(' .. field(g, 'last-delivered-id'), '+')
    end
    out[#out + 1] = tw_line('group', shard, queue, name, tw_int(field(g, 'consumers')),
      tw_int(field(g, 'pending')), tw_int(lag))
    local entries = redis.call('XPENDING', key, name, '-', '+', read)
    table.sort(entries, function(a, b)
      return a[3] > b[3]
    end)
    for i = 1, math.min(most, #entries) do
      local e = entries[i]
      local body = redis.call('XRANGE', key, e[1], e[1])
      local run_id = body[1] and field(body[1][2], 'run_id')
      out[#out + 1] = tw_line('pending', shard, queue, name, e[2], e[1], tw_int(e[3]),
        tw_int(e[4]), tw_text(run_id))
    end
  end
end
return out
