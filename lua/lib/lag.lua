-- The tick's lag histogram (dispatch_tick.lua).
--
--   lag_bounds(text) -> bounds   the bounds of 'ms,ms,...' as an ascending list of numbers.
--   lag_bucket(bounds, lag) -> i   the histogram bucket of a lag.
--
-- Bounds arrive as text (ARGV) and are parsed once per distinct text: this table lives
-- as long as the library, and a tick pays nothing for it but a lookup. Only the tick's
-- one text (LAG_BUCKETS_MS) ever reaches it.
local lag_bounds_parsed = {}
local function lag_bounds(text)
  local bounds = lag_bounds_parsed[text]
  if bounds == nil then
    bounds = {}
    for v in string.gmatch(text, '[^,]+') do
      bounds[#bounds + 1] = tonumber(v)
    end
    lag_bounds_parsed[text] = bounds
  end
  return bounds
end

-- A lag's bucket: the index of the first bound >= lag, or #bounds + 1 past them all.
-- Found by halving: a backlog's lags sit past most bounds.
local function lag_bucket(bounds, lag)
  local lo, hi = 1, #bounds + 1
  while lo < hi do
    local mid = lo + (hi - lo - (hi - lo) % 2) / 2
    if lag <= bounds[mid] then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end
