--[[ audit_shard: what an audit pass needs to know of a shard before it reads the rest
  (read only; docs/operations/auditing.md).
  KEYS[1] meta  HASH tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] due   ZSET tag..'due', tenant -> earliest near due_ms
  ARGV[1] now_ms override ('' = TIME)   ARGV[2] most tenants of the due index read
          (<= 1000), earliest first
  Derived keys (same tag): lease, near:<tenant>.
  Returns: {now_ms, promoted_until, lease, due_runs, tenants}
           now_ms is the shard clock as the tick holds it (max(TIME, hwm)); lease is the
           lease key's '<node>/<epoch>' ('' = no node owns the shard); due_runs counts
           the runs due by now in the near levels of the first ARGV[2] tenants of the due
           index, tenants how many tenants were read. More due than a tick takes
           (tick_batch) is a backlog.
  Errors:  none. ]]
local rcall = redis.call
local meta_key, due_key = KEYS[1], KEYS[2]
local now_override, most = ARGV[1], tonumber(ARGV[2])
local tag = string.sub(meta_key, 1, -5)

--!include lib/clock.lua
--!include lib/wheel.lua

local now = clock_shard_ms(meta_key, now_override)
local lease = rcall('GET', tag .. 'lease') or ''
local tenants = rcall('ZRANGE', due_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, most)
local due_runs = 0
for i = 1, #tenants do
  due_runs = due_runs + rcall('ZCOUNT', tag .. 'near:' .. tenants[i], '-inf', now)
end
return { now, wheel_promoted_until(meta_key), lease, due_runs, #tenants }
