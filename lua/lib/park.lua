-- Backlog caps: a (tenant, queue) whose ready stream holds max_backlog undelivered entries
-- or more is not sent to; its due runs wait in the wheel, parked (dispatch_tick.lua).
--   tag..'caps'    HASH tenant -> its own max_backlog (0: no cap), written by
--                  timewheel/dispatch/rates.py; a tenant not in it has the deployment's
--                  default (Settings.tenant_max_backlog, an argument of the tick).
--   tag..'park:'..tenant..':'..queue   ZSET run_id -> due_ms: the parked runs of one
--                  (tenant, queue); their records still say scheduled. A parked run is in
--                  the wheel as much as a near-level one (record_sent, wheel_remove,
--                  audit_level look here too), just not in its tenant's near level, so
--                  the tick does not read it again until its stream drains.
--   tag..'parked'  HASH tenant..':'..queue -> '' (names hold no ':'): the (tenant, queue)
--                  pairs with parked runs; the tick checks each of them once per call.
-- Undelivered entries: XLEN of the stream less the entries its consumer group holds
-- pending (read, not yet acknowledged); acknowledged entries are deleted at once
-- (lib/delivery.lua), so that is exactly the entries no consumer has read. XLEN alone
-- decides while it is below the cap (one O(1) call per stream per tick call); only a
-- stream at or over its cap is asked for its groups (XINFO GROUPS; with several groups,
-- the one that read most counts).
--
--   park_caps(tag, default) -> cap_of   cap_of(tenant) -> cap (0: none), read once per
--       tenant per call.
--   park_undelivered(stream, cap) -> n   undelivered entries, exact when n >= cap.
--   park_run(tag, tenant, queue, run_id, due)   park one run.
--   park_release(tag, cap_of, due_key, limit) -> parked, released, pairs   put back
--       into the near level, oldest first, as many parked runs of each pair as its stream
--       has room for (at most limit in all), and the tenant into the due index at its
--       earliest; drop pairs left empty. Returns runs still parked, runs put back and
--       {tenant, queue, parked, ...} of the pairs still parked.
--   park_counts(tag) -> parked, {tenant, queue, parked, ...}   the runs parked per pair.

local function park_caps(tag, default)
  local caps, own = {}, nil
  return function(tenant)
    local cap = caps[tenant]
    if cap == nil then
      if own == nil then
        own = redis.call('EXISTS', tag .. 'caps') == 1
      end
      cap = own and tonumber(redis.call('HGET', tag .. 'caps', tenant)) or default
      caps[tenant] = cap
    end
    return cap
  end
end

local function park_undelivered(stream, cap)
  local n = redis.call('XLEN', stream)
  if n < cap or n == 0 then
    return n
  end
  local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
  if not ok then
    return n
  end
  local most = 0
  for _, g in ipairs(groups) do
    for j = 1, #g, 2 do
      if g[j] == 'pending' and g[j + 1] > most then
        most = g[j + 1]
      end
    end
  end
  return n - most
end

local function park_run(tag, tenant, queue, run_id, due)
  redis.call('ZADD', tag .. 'park:' .. tenant .. ':' .. queue, due, run_id)
  redis.call('HSET', tag .. 'parked', tenant .. ':' .. queue, '')
end

local function park_release(tag, cap_of, due_key, limit)
  local parked_key = tag .. 'parked'
  if redis.call('EXISTS', parked_key) == 0 then
    return 0, 0, {}
  end
  local pairs_ = redis.call('HKEYS', parked_key)
  local still, released, out = 0, 0, {}
  for _, pair in ipairs(pairs_) do
    local tenant, queue = string.match(pair, '^([^:]+):(.+)$')
    local key = tag .. 'park:' .. pair
    local cap = cap_of(tenant)
    local room = limit - released
    if cap > 0 then
      room = math.min(room, cap - park_undelivered(tag .. 'q:' .. pair, cap))
    end
    if room > 0 then
      local ids = redis.call('ZRANGE', key, 0, room - 1, 'WITHSCORES')
      if #ids > 0 then
        local args = {}
        for i = 1, #ids, 2 do
          args[i], args[i + 1] = ids[i + 1], ids[i]
        end
        redis.call('ZADD', tag .. 'near:' .. tenant, unpack(args))
        redis.call('ZREMRANGEBYRANK', key, 0, #ids / 2 - 1)
        redis.call('ZADD', due_key, 'LT', ids[2], tenant)
        released = released + #ids / 2
      end
    end
    local left = redis.call('ZCARD', key)
    if left == 0 then
      redis.call('HDEL', parked_key, pair)
    else
      still = still + left
      out[#out + 1], out[#out + 2], out[#out + 3] = tenant, queue, left
    end
  end
  return still, released, out
end

local function park_counts(tag)
  local total, out = 0, {}
  for _, pair in ipairs(redis.call('HKEYS', tag .. 'parked')) do
    local n = redis.call('ZCARD', tag .. 'park:' .. pair)
    local tenant, queue = string.match(pair, '^([^:]+):(.+)$')
    total = total + n
    out[#out + 1], out[#out + 2], out[#out + 3] = tenant, queue, n
  end
  return total, out
end
