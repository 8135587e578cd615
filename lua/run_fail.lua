--[[ run_fail: executors' attempts failed, of runs of one shard: acknowledge the entries, then
  retry each run later or bury it. One call takes one run or many.
  KEYS[1] events  STREAM tag..'events' (the tag is KEYS[1] minus 'events')
  KEYS[2..] the ready streams (tag..'q:'..tenant..':'..queue) the runs were delivered on
  ARGV[1] consumer group   ARGV[2] retry defaults JSON {max_attempts, initial_s, factor,
  max_s, jitter}   ARGV[3] bucket_ms   ARGV[4] now_ms override ('' = TIME)
  ARGV[5] event log cap   ARGV[6] wake channel ('' = none)   ARGV[7] shard number (the wake
  message)   ARGV[8] rand seed in [0, 1): the call's jitter draws, one per run retried or
  buried, come from it (a number parsed per run was a fiftieth of a retry)
  ARGV[9..] seven per run: stream (its index among KEYS[2..]: 1 = KEYS[2]), stream entry
  id, run_id, attempt, error text, permanent ('1': dead-letter now, no retry), delay_ms
  before the retry ('' = the retry policy's backoff; an executor's Retry-After, say)
  Derived keys (same tag): t:<xy>, meta, near:<tenant>, parked, park:<tenant>:<queue>,
  due, w:<bucket>, wheel,
  dead:<tenant>, use:<tenant>, and for a schedule's run s:<sid> (lib/retry.lua).
  Returns: two values per run, in ARGV's order, as one flat array (run i's {code, detail}
  at 2i - 1 and 2i: Redis converts a nested table of a reply at some 4k instructions):
           {1, due_ms}     back in the wheel for attempt + 1 at due_ms
           {2, entry_id}   dead-lettered (max_attempts reached, or permanent)
           {0, 0}          the entry was acknowledged but the run had moved on (stale;
                           or the same run earlier in this call)
           {-1, 0}         NOT_FOUND: no record for this run id in this shard.
  The retries of one call due before promoted_until go into the near level with one ZADD
  per tenant, and share one event-log entry (e=retry_scheduled,
  runs='id:tenant:attempt:due_ms,...', lib/retry.lua); each dead letter has its own, as before. ]]
local events_key, group = KEYS[1], ARGV[1]
local defaults, bucket_ms = cjson.decode(ARGV[2]), tonumber(ARGV[3])
local now_override, event_cap, wake_channel, shard = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
-- The jitter draws: MINSTD (state * 48271 mod 2^31 - 1, whose products stay exact in a
-- double) from the caller's seed, a state in [1, 2^31 - 2].
local draws = math.floor(tonumber(ARGV[8]) * 2147483646) + 1
local tag = string.sub(events_key, 1, -7)

--!include lib/bodies.lua
--!include lib/record.lua
--!include lib/delivery.lua
--!include lib/clock.lua
--!include lib/retry.lua

local n = delivery_ack_all(KEYS, ARGV, 9, 7, group)
-- meta, read once with the body layout: where the near level ends, and the event log's
-- archive mark.
local meta = body_meta(tag, 'promoted_until', 'archived', 'archive_cap')
local promoted_until = tonumber(meta[1]) or 0
local record_of = delivery_loader(tag, ARGV, 9, 7, n, promoted_until)
local now = clock_now_ms(now_override)
local ctx = {
  now = now, now_packed = cmsgpack.pack(now), defaults = defaults, reason = 'failed',
  bucket_ms = bucket_ms, events_key = events_key, event_cap = event_cap,
  wake_channel = wake_channel, shard = shard, promoted_until = promoted_until, policies = {},
  retried = { runs = {}, errors = {}, near = {}, marks = {}, n = 0, wake = 0 }, heads = {},
  archived = meta[2], archive_cap = meta[3],
}
local replies, handled, numbers = delivery_array(ARGV, 2 * n), {}, {}
local at = 9
for i = 1, n do
  local run_id, text = ARGV[at + 2], ARGV[at + 3]
  local attempt = numbers[text] or delivery_number(numbers, text)
  if handled[run_id] then
    replies[2 * i - 1], replies[2 * i] = 0, 0
  else
    local r, bkey, field, raw = record_of(i)
    if r == nil then
      replies[2 * i - 1], replies[2 * i] = -1, 0
    elseif r[R_STATE] ~= ST_DISPATCHED or r[R_ATTEMPT] ~= attempt then  -- delivery_live
      replies[2 * i - 1], replies[2 * i] = 0, 0
    else
      ctx.field, ctx.raw, ctx.error, ctx.permanent = field, raw, ARGV[at + 4], ARGV[at + 5] == '1'
      local delay = ARGV[at + 6]
      ctx.delay_ms = delay ~= '' and tonumber(delay) or nil
      draws = draws * 48271 % 2147483647
      ctx.rand = (draws - 1) / 2147483646
      local outcome, detail = retry_or_bury(tag, bkey, run_id, r, ctx)
      handled[run_id] = true
      replies[2 * i - 1], replies[2 * i] = outcome == 'retry' and 1 or 2, detail
    end
  end
  at = at + 7
end
retry_flush(tag, ctx)
return replies
