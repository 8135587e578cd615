-- Tenants' dispatch rates, kept as token buckets (dispatch_tick.lua).
--   tag..'rates'   HASH tenant -> runs/s this shard may send for it (timewheel/dispatch/rates.py)
--   tag..'tokens'  HASH tenant -> 'tokens:stamp_ms', each rate-limited tenant's bucket
-- A bucket holds one second of its rate (at least 1 token) and refills at the rate; each
-- near entry a tenant consumes spends a token.
--
--   rate_buckets(tag, tenants, now) -> rate, tokens   for the rate-limited ones among
--       tenants (a list): rate[t] runs/s and tokens[t] refilled up to now; tenants with
--       no rate are in neither table.
--   rate_next_token_ms(tokens, rate, now) -> when a bucket short of a token has one.
--   rate_save(tag, tenant, tokens, now)   store a bucket as it is at now.

local function rate_buckets(tag, tenants, now)
  local rate, tokens = {}, {}
  if #tenants == 0 or redis.call('EXISTS', tag .. 'rates') == 0 then
    return rate, tokens
  end
  local rates = redis.call('HMGET', tag .. 'rates', unpack(tenants))
  local limited = {}
  for i = 1, #tenants do
    local r = tonumber(rates[i])
    if r and r > 0 then
      rate[tenants[i]] = r
      limited[#limited + 1] = tenants[i]
    end
  end
  if #limited > 0 then
    local states = redis.call('HMGET', tag .. 'tokens', unpack(limited))
    for i = 1, #limited do
      local r, cap = rate[limited[i]], math.max(1, rate[limited[i]])
      local have, stamp = string.match(states[i] or '', '^([^:]+):(%d+)$')
      local t = cap
      if have then
        t = math.min(cap, tonumber(have) + math.max(0, now - tonumber(stamp)) * r / 1000)
      end
      tokens[limited[i]] = t
    end
  end
  return rate, tokens
end

local function rate_next_token_ms(tokens, rate, now)
  return now + math.ceil((1 - tokens) * 1000 / rate)
end

local function rate_save(tag, tenant, tokens, now)
  redis.call('HSET', tag .. 'tokens', tenant, string.format('%.3f:%d', tokens, now))
end
