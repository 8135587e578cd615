-- Hashes as flat lists. HGETALL, a stream entry's fields and the JSON lists Python sends
-- give a hash as {field, value, field, value, ...}.
--
--   hash_table(flat, into) -> into   the pairs of flat set into the table `into` (a new
--       table when nil) as into[field] = value.
local function hash_table(flat, into)
  local t = into or {}
  for i = 1, #flat, 2 do
    t[flat[i]] = flat[i + 1]
  end
  return t
end
