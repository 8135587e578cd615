--[[ audit_publish: store the latest complete pass of the continuous auditor, fenced by
  the auditor lease (timewheel/audit/continuous.py, docs/operations/auditing.md).
  KEYS[1] lease   STRING {prefix:audit}:lease = '<node>/<epoch>' (lua/lease_acquire.lua)
  KEYS[2] latest  STRING {prefix:audit}:latest, the pass as JSON
  ARGV[1] node id   ARGV[2] epoch   ARGV[3] the pass, JSON (bounded by the caller)
  Returns: {1}    stored, replacing the previous pass
  Errors:  {-3}   LEASE_LOST: the lease no longer names this node at this epoch; a node
                  that lost the auditor lease never overwrites its successor's pass. ]]
local lease_key, latest_key = KEYS[1], KEYS[2]
local node, epoch, report = ARGV[1], ARGV[2], ARGV[3]

--!include lib/lease.lua

if not lease_named(lease_key, node, epoch) then
  return { -3 }
end
redis.call('SET', latest_key, report)
return { 1 }
