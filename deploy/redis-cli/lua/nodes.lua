-- The scheduler nodes' heartbeats. KEYS[1] <prefix>:nodes.
-- Answers: 'node <node> <last heartbeat iso> <age ms>' per node, latest first; the age is
-- by Redis's clock (nodes are dropped once silent for a lease TTL, at the next lease round).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = { 'ok' }
local nodes = redis.call('ZREVRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #nodes, 2 do
  local beat = tonumber(nodes[i + 1])
  out[#out + 1] = tw_line('node', tw_text(nodes[i]), tw_iso(beat), tw_int(now - beat))
end
return out
