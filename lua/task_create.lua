--[[ task_create: schedule new one-shot runs of one shard (one, or a batch: one call amortizes
  the script's fixed cost, about half of a lone create).
  KEYS[1] meta    HASH   tag..'meta' (the shard tag is KEYS[1] minus 'meta')
  KEYS[2] events  STREAM tag..'events'
  ARGV[1] bucket_ms   ARGV[2] now_ms override ('' = TIME)   ARGV[3] event log cap
  ARGV[4] wake channel ('' = none)   ARGV[5] shard number (the wake message)
  ARGV[6] cap mode: '' (no cap checked), 'each' (each run on its own, in order) or 'all'
          (a capped tenant's runs of the call are all created or all refused; every one
          of them counts, idempotent duplicates too)
  ARGV[7] m, the number of capped tenants ('' or 0: none)
  ARGV[8 .. 7 + 2m] m pairs: tenant, cap = the most counted runs not finished
          (lib/usage.lua, usage_held) this shard may hold for the tenant after the call
          (its share of max_pending: timewheel/limits.py); a tenant not named is unchecked
  ARGV[8 + 2m ..] n groups of 8 values, one per run (n <= 500):
          run_id (= task id), tenant, queue, run_at_ms ('' = use delay), delay_ms,
          payload (JSON text), opts (JSON text of non-default policy fields, '' = none),
          idempotent ('1': the id was derived from an idempotency key)
  Derived keys (same tag): t:<xy>, near:<tenant>, due, w:<bucket>, wheel, use:<tenant>
  (the runs created count in the tenant's q:<queue> and bytes; lib/usage.lua).
  Returns: one reply per run, in order:
           {1, due_ms, wake, now_ms}  created; wake = 1 if it moved the shard's next
                                      action earlier; now_ms = the record's created time
           {0, record}                an idempotent duplicate: the existing record
           {2, run_id}                a random-id collision (not created; practically
                                      never: ids carry 65 random bits)
           {3, held, cap}             refused: the run would pass its tenant's cap
                                      (held = the tenant's counted runs not finished in
                                      the shard); nothing is written for it. Under 'each'
                                      a duplicate at the cap still answers {0, record}.
  Events:  one 'created' entry per call, for the runs it created: runs =
           'id:tenant:queue:due_ms,...' (names and ids hold no ':' or ','), at = now.
  Errors:  malformed input is an error reply. ]]
local meta_key, events_key = KEYS[1], KEYS[2]
local bucket_ms, now_override, event_cap = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local wake_channel, shard = ARGV[4], ARGV[5]
local tag = string.sub(meta_key, 1, -5)
local cap_mode, capped = ARGV[6], tonumber(ARGV[7]) or 0
local GROUP, FIRST = 8, 8 + 2 * capped

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/usage.lua
--!include lib/wheel.lua
--!include lib/wake.lua
--!include lib/events.lua

local n = (#ARGV - FIRST + 1) / GROUP
if n ~= math.floor(n) or n < 1 or n > 500 then
  return redis.error_reply('ERR timewheel: create takes 1..500 groups of 8 values')
end
-- caps[tenant] = {cap, held}: held is read once per call, at the tenant's first run,
-- and counts the runs this call creates. refused[tenant] = true under 'all' for a
-- tenant whose runs of the call would pass its cap.
local caps, refused = nil, nil
if capped > 0 and cap_mode ~= '' then
  caps = {}
  for j = 0, capped - 1 do
    local tenant = ARGV[8 + 2 * j]
    caps[tenant] = { tonumber(ARGV[9 + 2 * j]), usage_held(usage_key(tag, tenant)) }
  end
  if cap_mode == 'all' then
    local asked = {}
    for i = 0, n - 1 do
      local tenant = ARGV[FIRST + i * GROUP + 1]
      asked[tenant] = (asked[tenant] or 0) + 1
    end
    refused = {}
    for tenant, c in pairs(caps) do
      if asked[tenant] ~= nil and c[2] + asked[tenant] > c[1] then
        refused[tenant] = true
      end
    end
  end
end
local now = clock_now_ms(now_override)
local promoted_until = wheel_promoted_until(meta_key)
local replies, woken, created, tally = {}, 0, {}, {}
-- The far and distant buckets this call put into, and what they hold (lib/wheel.lua).
local seen = {}
for i = 0, n - 1 do
  local a = FIRST + i * GROUP
  local run_id, tenant, queue, due_text, delay_ms, payload, opts, idempotent =
    unpack(ARGV, a, a + GROUP - 1)
  local c = caps and caps[tenant]
  if c ~= nil and (refused ~= nil and refused[tenant] or c[2] >= c[1]) then
    local bkey = body_key(tag, run_id)
    local existing, raw = nil, nil
    if refused == nil then
      existing, raw = record_load(bkey, run_id)
    end
    if existing ~= nil and idempotent == '1' and existing[R_TENANT] == tenant then
      replies[i + 1] = { 0, existing.sent and record_pack(existing) or raw }
    else
      replies[i + 1] = { 3, c[2], c[1] }
    end
  else
    local due_ms
    if due_text ~= '' then
      due_ms = tonumber(due_text)
    else
      due_ms = now + tonumber(delay_ms)
      due_text = string.format('%d', due_ms)
    end
    if opts == '' then
      opts = nil
    end
    -- HSETNX is the existence check and the write in one call (the common case).
    local record = record_pack({ ST_SCHEDULED, 0, due_ms, tenant, queue, now, payload, opts,
      nil, nil, nil, nil })
    if record_create(tag, run_id, record) == 0 then
      local existing, raw = record_load(body_key(tag, run_id), run_id)
      if idempotent == '1' and existing[R_TENANT] == tenant then
        -- A sent run's record does not say so (lib/record.lua): answer it as it is.
        replies[i + 1] = { 0, existing.sent and record_pack(existing) or raw }
      else
        replies[i + 1] = { 2, run_id }
      end
    else
      local wake = wheel_place(tag, meta_key, run_id, tenant, due_ms, bucket_ms, promoted_until,
        seen)
      woken = math.max(woken, wake)
      created[#created + 1] = run_id .. ':' .. tenant .. ':' .. queue .. ':' .. due_text
      usage_tally(tally, tenant, queue, #payload)
      if c ~= nil then
        c[2] = c[2] + 1
      end
      replies[i + 1] = { 1, due_ms, wake, now }
    end
  end
end
if #created > 0 then
  -- One entry for the whole call (a batch of 200 costs one XADD, not 200), counted as
  -- the runs it names against the cap (lib/events.lua). No payload: the log stays
  -- small, and whoever needs the payload of a pending run reads it from the record.
  event_emit(events_key, event_cap_for(event_cap, #created), 'e', 'created',
    'at', string.format('%d', now), 'runs', table.concat(created, ','))
end
usage_flush(tag, tally)
wake_publish(woken, wake_channel, shard)
return replies
