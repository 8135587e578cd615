-- The shard primary's clock. Every due decision uses it (docs/design.md); an
-- override (non-empty string of epoch ms) exists for deterministic tests only.
--
--   clock_now_ms(override) -> ms   TIME in epoch ms, or the override.
--   clock_shard_ms(meta_key, override) -> now, clock_back_ms   the clock held at the
--       shard's high-water mark (tick, promote).
local function clock_now_ms(override)
  if override ~= nil and override ~= '' then
    return tonumber(override)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The shard's now for the wheel's own moves (tick, promote): the clock, but never before
-- the high-water mark the tick leaves in meta ('hwm'), so a clock that steps back neither
-- re-opens a window nor delays runs already due. Returns now and how far the clock is
-- behind the mark (0 if it is not).
local function clock_shard_ms(meta_key, override)
  local now = clock_now_ms(override)
  local hwm = tonumber(redis.call('HGET', meta_key, 'hwm')) or 0
  if now < hwm then
    return hwm, hwm - now
  end
  return now, 0
end
