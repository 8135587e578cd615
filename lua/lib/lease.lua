-- Fencing for scheduler scripts (DESIGN.md section 5). The shard lease key
-- (tag..'lease', SET NX PX by the owner) holds '<node>/<epoch>'. An empty node means
-- the caller runs unfenced (single-node mode and tests); otherwise the lease must still
-- name this node at this epoch, or the call refuses with LEASE_LOST (-3).
local function lease_holds(tag, node, epoch)
  if node == nil or node == '' then
    return true
  end
  return redis.call('GET', tag .. 'lease') == node .. '/' .. epoch
end
