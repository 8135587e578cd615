--[[ lease_members: record that a scheduler node is alive and list the live nodes.
  KEYS[1] nodes  ZSET prefix..':nodes', node id -> last heartbeat (ms, this server's TIME)
  ARGV[1] node id   ARGV[2] ttl_ms: a node silent for longer is dead
  ARGV[3] leaving ('1': remove this node instead, on graceful shutdown)
  Returns: {now_ms, node, node, ...}   the live nodes, this one included unless leaving
  Dead entries are removed here, so the set stays as small as the fleet. ]]
local rcall = redis.call
local nodes_key = KEYS[1]
local node, ttl_ms, leaving = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'

--!include lib/clock.lua

local now = clock_now_ms()
if leaving then
  rcall('ZREM', nodes_key, node)
else
  rcall('ZADD', nodes_key, now, node)
end
rcall('ZREMRANGEBYSCORE', nodes_key, '-inf', '(' .. (now - ttl_ms))
local live = rcall('ZRANGE', nodes_key, 0, -1)
local out = { now }
for i = 1, #live do
  out[#out + 1] = live[i]
end
return out
