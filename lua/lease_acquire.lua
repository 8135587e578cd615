--[[ lease_acquire: take a free shard lease, or renew one this node already holds.
  KEYS[1] lease  STRING tag..'lease' = '<node>/<epoch>', with a TTL
  KEYS[2] meta   HASH   tag..'meta' (field epoch: the shard's fencing counter)
  ARGV[1] node id   ARGV[2] ttl_ms
  Returns: {epoch}          held by this node from now on at this epoch. Every new
                            acquisition increments the epoch, so a node that lost the
                            lease and comes back can never pass for the current owner.
  Errors:  {-3, holder}     LEASE_LOST: another node holds it ('<node>/<epoch>'). ]]
local rcall = redis.call
local lease_key, meta_key = KEYS[1], KEYS[2]
local node, ttl_ms = ARGV[1], ARGV[2]

--!include lib/lease.lua

local holder = rcall('GET', lease_key)
if holder then
  local owner, epoch = lease_parse(holder)
  if owner == node then
    rcall('PEXPIRE', lease_key, ttl_ms)
    return { tonumber(epoch) }
  end
  return { -3, holder }
end
local epoch = rcall('HINCRBY', meta_key, 'epoch', 1)
rcall('SET', lease_key, lease_value(node, epoch), 'PX', ttl_ms)
return { epoch }
