--[[ lease_release: give a shard lease up at once (graceful shutdown, rebalancing).
  KEYS[1] lease  STRING tag..'lease' = '<node>/<epoch>'
  ARGV[1] node id   ARGV[2] epoch
  Returns: {1} released   {0} it was not ours any more (nothing changed) ]]
local lease_key = KEYS[1]
local node, epoch = ARGV[1], ARGV[2]

--!include lib/lease.lua

if not lease_named(lease_key, node, epoch) then
  return { 0 }
end
redis.call('DEL', lease_key)
return { 1 }
