-- One shard's lease. KEYS[1] the shard's lease key.
-- Answers: 'lease <shard> <node> <epoch> <ttl ms> <meta epoch>' ('-' where none): the
-- node holding the shard, the epoch it holds it at, the lease's time left, and the
-- shard's fencing counter (meta.epoch: the epoch of the latest acquisition).
local tag = tw_tag(KEYS[1])
local lease = redis.call('GET', KEYS[1])
local node, epoch, ttl = nil, nil, nil
if lease then
  node, epoch = string.match(lease, '^(.*)/(%d+)$')
  ttl = redis.call('PTTL', KEYS[1])
end
return { 'ok', tw_line('lease', tw_int(tw_shard(tag)), tw_text(node), tw_int(epoch),
  tw_int(ttl), tw_int(redis.call('HGET', tag .. 'meta', 'epoch'))) }
