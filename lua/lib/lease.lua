-- Shard leases and fencing (docs/design.md). The shard lease key (tag..'lease', SET
-- PX by its owner, lease_acquire.lua) holds '<node>/<epoch>'.
--
--   lease_value(node, epoch)   the lease key's value for this node at this epoch.
--   lease_parse(value) -> node, epoch   the other way round (epoch as text).
--   lease_named(lease_key, node, epoch)   whether the lease names this node at this epoch.
--   lease_holds(tag, node, epoch)   the fence of scheduler scripts: an empty node means the
--       caller runs unfenced (single-node mode and tests); otherwise the lease must still
--       name this node at this epoch, or the call refuses with LEASE_LOST (-3).
local function lease_value(node, epoch)
  return node .. '/' .. epoch
end

local function lease_parse(value)
  return string.match(value, '^(.*)/(%d+)$')
end

local function lease_named(lease_key, node, epoch)
  return redis.call('GET', lease_key) == lease_value(node, epoch)
end

local function lease_holds(tag, node, epoch)
  if node == nil or node == '' then
    return true
  end
  return lease_named(tag .. 'lease', node, epoch)
end
