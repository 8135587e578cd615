--[[ lease_renew: extend a shard lease this node holds at this epoch.
  KEYS[1] lease  STRING tag..'lease' = '<node>/<epoch>'
  ARGV[1] node id   ARGV[2] epoch   ARGV[3] ttl_ms
  Returns: {1}    renewed for another ttl_ms
  Errors:  {-3}   LEASE_LOST: expired or taken by another node; the caller drops the
                  shard at once and may acquire it again later under a new epoch. ]]
local lease_key = KEYS[1]
local node, epoch, ttl_ms = ARGV[1], ARGV[2], ARGV[3]

--!include lib/lease.lua

if not lease_named(lease_key, node, epoch) then
  return { -3 }
end
redis.call('PEXPIRE', lease_key, ttl_ms)
return { 1 }
