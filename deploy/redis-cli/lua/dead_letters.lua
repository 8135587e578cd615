-- A tenant's dead letters in one shard. KEYS[1] the shard's dead:<tenant> stream;
-- ARGV[1] most entries to list, newest first.
-- Answers: 'dead <shard> <length>', then per entry
--   'entry <dead iso> <shard> <entry id> <run id> <queue> <attempt> <reason> <error>'
local key, most = KEYS[1], tonumber(ARGV[1])
local shard = tw_int(tw_shard(tw_tag(key)))
local out = { 'ok', tw_line('dead', shard, tw_int(redis.call('XLEN', key))) }
if most > 0 then
  for _, e in ipairs(redis.call('XREVRANGE', key, '+', '-', 'COUNT', most)) do
    local f = {}
    for i = 1, #e[2], 2 do
      f[e[2][i]] = e[2][i + 1]
    end
    out[#out + 1] = tw_line('entry', tw_iso(f.dead_ms), shard, e[1], tw_text(f.run_id),
      tw_text(f.queue), tw_int(f.attempt), tw_text(f.reason), tw_text(f.error))
  end
end
return out
