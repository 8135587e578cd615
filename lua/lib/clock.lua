-- The shard primary's clock. Every due decision uses it (DESIGN.md section 4); an
-- override (non-empty string of epoch ms) exists for deterministic tests only.
local function clock_now_ms(override)
  if override ~= nil and override ~= '' then
    return tonumber(override)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
