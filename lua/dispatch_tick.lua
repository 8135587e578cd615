--[[ dispatch_tick: dispatch due runs of one shard into their ready streams, tenants in turn.
  KEYS[1] meta    HASH   tag..'meta' (fields hwm, promoted_until; the tag is KEYS[1] minus 'meta')
  KEYS[2] due     ZSET   tag..'due', tenant -> earliest near due_ms
  KEYS[3] events  STREAM tag..'events'
  ARGV[1] limit: most runs to dispatch in this call (<= 5000: one call blocks Redis
          for about 10 us per run, so 1000 keeps a tick near 10 ms)
  ARGV[2] now_ms override ('' = TIME)   ARGV[3] node ('' = unfenced)   ARGV[4] epoch
  ARGV[5] event log cap   ARGV[6] misfire_ms   ARGV[7] bucket_ms
  ARGV[8] lag histogram bounds, ms ascending, comma-separated ('' = one bucket)
  ARGV[9] default max_backlog of a tenant not in caps (0 = no cap)
  Derived keys (same tag): near:<tenant>, t:<xy>, q:<tenant>:<queue>, lease, wheel,
  dead:<tenant> (a run past its expires_at is dead-lettered, reason expired, not sent),
  s:<sid>, sr:<sid>, x:<bucket>, expiry (a schedule's run may be skipped: misfire past
  misfire_ms under its catchup policy, or overlap; see lib/schedule.lua), rates (HASH
  tenant -> runs/s this shard may send for it, written by timewheel/dispatch/rates.py), tokens
  (HASH tenant -> 'tokens:stamp_ms', the rate-limited tenants' buckets), caps, parked,
  park:<tenant>:<queue> (lib/park.lua).
  Returns: {dispatched, next_due_ms, now_ms, clock_back_ms, next_bucket_ms, promoted_until,
           consumed, {tenant, count, ...}, {count, ...}, backlog, lag_sum_ms,
           {tenant, held, ...}, {tenant, lag_sum_ms, ...}, parked, released,
           {tenant, queue, parked, ...}}
           next_due_ms / next_bucket_ms are -1 when nothing waits; consumed (near entries
           taken, stale ones included) = limit means more may be due now; the lists give
           runs dispatched per tenant and, for metrics, how many runs' lag (now - due_ms)
           fell in each bucket: lag <= bound i for the i-th count, one more count past the
           last bound (empty when none was sent); lag_sum_ms adds up the lags. backlog
           counts runs still due after this call (0 unless consumed = limit); the last
           list but one gives, per tenant held back by its rate, its runs still due;
           the next, per tenant with runs dispatched, their lags added up (ms); parked
           counts the runs waiting in the wheel for their stream to drain after this
           call, released those this call put back into the near level, and the last
           list gives the parked runs per (tenant, queue).
  Errors:  {-3} LEASE_LOST: ARGV[3] no longer holds the shard at epoch ARGV[4].
  Fairness: deficit round robin with unit cost. Each round gives every tenant with due
  runs an equal share of what is left of the limit, so one tenant's backlog due in the
  same second takes its turn and cannot hold back another tenant's runs.
  Rate: a tenant listed in rates has a token bucket (lib/rate.lua: capacity one second of
  its rate, at least 1): each near entry it consumes spends a token. Out of tokens, it is
  held back: its entry in the due index moves to when the next token is due, so the
  scheduler sleeps until then instead of ticking it. Held-back runs stay in the near
  level, never dropped.
  Backlog cap (lib/park.lua): a run whose (tenant, queue) stream holds its max_backlog
  undelivered entries is not sent but parked: it leaves the near level for the pair's
  park set, its record still scheduled. The tenant's runs of other queues go on. Each
  call first checks every parked pair's stream (one XLEN, no run read) and puts back, oldest
  first, as many of its runs as the stream has room for; they are then sent in due
  order with the tenant's other due runs.
  Clock: now = max(TIME, hwm). A clock that steps back neither re-opens a window nor
  delays runs already due by the high-water mark; clock_back_ms reports the step. ]]
local rcall = redis.call
local meta_key, due_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local limit, now_override, node, epoch = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local event_cap, misfire_ms, bucket_ms = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local lag_bounds_text, default_cap = ARGV[8], tonumber(ARGV[9]) or 0
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/events.lua
--!include lib/schedule.lua
--!include lib/retry.lua
--!include lib/lease.lua
--!include lib/lag.lua
--!include lib/rate.lua
--!include lib/park.lua

if not lease_holds(tag, node, epoch) then
  return { -3 }
end

local now, clock_back = clock_shard_ms(meta_key, now_override)
-- Numbers go to Redis as text, formatted once: Redis's own conversion of a number
-- argument goes through '%.17g', about 0.3 us more each, and a tick sends several per
-- tenant it serves.
local now_text = string.format('%d', now)

local sched_ctx = schedule_ctx(tag, now, bucket_ms, misfire_ms, events_key, event_cap)
sched_ctx.sent = {}  -- runs this call sent (schedule_admit)

-- Backlog caps: cap_of(tenant), and per capped stream the entries it may still take.
local cap_of = park_caps(tag, default_cap)
local room = {}
local parked_now = 0

-- The lowest score of a sorted set (-1 if empty), and as Redis wrote it.
local function first_score(key)
  local first = rcall('ZRANGE', key, '0', '0', 'WITHSCORES')
  if first[2] == nil then
    return -1
  end
  return tonumber(first[2]), first[2]
end

-- Set up when the first run goes out (most ticks send none): the envelope table
-- (docs/concepts/runs.md), refilled for every run, and the lag histogram of
-- lag_bounds_text.
local entry, bounds, lag_counts
local lag_sum = 0
local tenant_lag = {}  -- tenant -> its dispatched runs' lags added up
-- An attempt number as text, and as its mark in the event's run list (':n,').
local attempt_texts, attempt_marks = {}, {}
local function attempt_text(n)
  local t = attempt_texts[n]
  if t == nil then
    t = string.format('%d', n)
    attempt_texts[n], attempt_marks[n] = t, ':' .. t .. ','
  end
  return t, attempt_marks[n]
end
local function dispatch_setup()
  entry = { 'run_id', '', 'task_id', '', 'tenant', '', 'queue', '', 'attempt', '',
    'due_ms', '', 'dispatched_ms', now_text, 'payload', '' }
  bounds = lag_bounds(lag_bounds_text)
  lag_counts = {}
  for i = 1, #bounds + 1 do
    lag_counts[i] = 0
  end
end
local ENTRY_BASE = 16  -- the 8 fields every envelope has; schedule_id, visibility follow

-- Dispatch one run; returns the mark of the attempt it went out with (':n,', for the
-- event's run list), or nil if the near entry was stale (its body gone or no longer
-- scheduled). The record is decoded into locals and rebuilt as a table only for the
-- checks that need one (expiry, schedules).
local function dispatch(tenant, run_id, streams)
  local task_id, bkey, field = run_place(tag, run_id)
  local raw = rcall('HGET', bkey, field)
  if not raw then
    return nil
  end
  local state, attempt, due, _, queue, _, payload, opts, _, _, sid = cmsgpack.unpack(raw)
  if state ~= ST_SCHEDULED then
    return nil
  end
  if queue == nil then
    queue = 'default'  -- stored short (lib/record.lua record_expand)
  end
  local r
  if opts and string.find(opts, 'expires_at_ms', 1, true) then
    local expires = cjson.decode(opts).expires_at_ms
    if expires and now > expires then
      r = record_unpack(raw)
      retry_or_bury(tag, bkey, run_id, r, { now = now, defaults = {}, permanent = true,
        error = 'not dispatched before expires_at', reason = 'expired',
        events_key = events_key, event_cap = event_cap, bucket_ms = bucket_ms })
      return nil
    end
  end
  local stream = streams[queue]
  if stream == nil then
    stream = tag .. 'q:' .. tenant .. ':' .. queue
    streams[queue] = stream
  end
  local cap = cap_of(tenant)
  if cap > 0 then
    local left = room[stream]
    if left == nil then
      left = cap - park_undelivered(stream, cap)
      room[stream] = left
    end
    if left <= 0 then
      park_run(tag, tenant, queue, run_id, due)
      parked_now = parked_now + 1
      return nil
    end
  end
  if sid and not schedule_admit(sched_ctx, bkey, run_id, r or record_unpack(raw)) then
    return nil
  end
  if entry == nil then
    dispatch_setup()
  end
  local sent_attempt, mark = attempt_text(attempt + 1)
  entry[2], entry[4], entry[6], entry[8] = run_id, task_id, tenant, queue
  entry[10], entry[12], entry[16] = sent_attempt, string.format('%d', due), payload
  local n = ENTRY_BASE
  if sid then
    entry[n + 1], entry[n + 2], n = 'schedule_id', sid, n + 2
  end
  if opts and string.find(opts, 'visibility_timeout_s', 1, true) then
    -- Only a task with its own visibility timeout carries it, for the executor's heartbeat.
    entry[n + 1] = 'visibility_timeout_ms'
    entry[n + 2] = string.format('%d', cjson.decode(opts).visibility_timeout_s * 1000)
    n = n + 2
  end
  rcall('XADD', stream, '*', unpack(entry, 1, n))
  if cap > 0 then
    room[stream] = room[stream] - 1
  end
  local lag = now - due
  local b = lag_bucket(bounds, lag)
  lag_counts[b], lag_sum = lag_counts[b] + 1, lag_sum + lag
  tenant_lag[tenant] = (tenant_lag[tenant] or 0) + lag
  -- The record is not rewritten: leaving the near level (serve, below) is what makes
  -- the run dispatched (record_sent in lib/record.lua).
  if sid then
    sched_ctx.sent[run_id] = true  -- still in the near level until serve's batch ends
  end
  return mark
end

-- Serve up to n due runs of one tenant; returns near entries consumed, runs dispatched.
-- All runs of the call go into one 'dispatched' event (runs = 'id:attempt,...'): one
-- XADD per tick instead of one per tenant served. runs holds id, ':attempt,', id, ...
local per_tenant, runs = {}, {}
local function serve(tenant, n)
  local near = tag .. 'near:' .. tenant
  local ids = rcall('ZRANGE', near, '-inf', now_text, 'BYSCORE', 'LIMIT', '0',
    string.format('%d', n))
  if #ids == 0 then
    return 0, 0
  end
  local sent, streams = 0, {}
  for i = 1, #ids do
    local mark = dispatch(tenant, ids[i], streams)
    if mark then
      runs[#runs + 1], runs[#runs + 2] = ids[i], mark
      sent = sent + 1
    end
  end
  -- ids are the lowest-scored members, so they are exactly ranks 0 .. #ids-1.
  rcall('ZREMRANGEBYRANK', near, '0', string.format('%d', #ids - 1))
  if sent > 0 then
    per_tenant[tenant] = (per_tenant[tenant] or 0) + sent
  end
  return #ids, sent
end

-- Parked pairs whose streams drained: their oldest runs go back to the near level first.
local still_parked, released, parked_pairs = park_release(tag, cap_of, due_key, limit)

local tenants = rcall('ZRANGE', due_key, '-inf', now_text, 'BYSCORE', 'LIMIT', '0',
  string.format('%d', limit))

-- Token buckets of the rate-limited tenants among them: rate[t] runs/s, tokens[t] now.
local rate, tokens = rate_buckets(tag, tenants, now)

local budget = limit
local dispatched, consumed = 0, 0
local active = tenants
while budget > 0 and #active > 0 do
  local share = math.max(1, math.floor(budget / #active))
  local still = {}
  for i = 1, #active do
    if budget <= 0 then
      break
    end
    local tenant = active[i]
    local want = math.min(share, budget)
    local t = tokens[tenant]
    if t then
      want = math.min(want, math.floor(t))
    end
    if want > 0 then
      local got, sent = serve(tenant, want)
      budget = budget - got
      consumed = consumed + got
      dispatched = dispatched + sent
      if t then
        tokens[tenant] = t - got
      end
      if got == want and (t == nil or tokens[tenant] >= 1) then
        still[#still + 1] = tenant
      end
    end
  end
  active = still
end

-- Repair each served tenant's entry in the due index to its earliest remaining run; a
-- tenant held back by its rate waits there until its next token is due.
local held = {}
for i = 1, #tenants do
  local tenant = tenants[i]
  local s, score = first_score(tag .. 'near:' .. tenant)
  if s < 0 then
    rcall('ZREM', due_key, tenant)
  else
    local t = tokens[tenant]
    if t and t < 1 then
      if s <= now then
        held[#held + 1] = tenant
        held[#held + 1] = rcall('ZCOUNT', tag .. 'near:' .. tenant, '-inf', now_text)
      end
      local next_token = rate_next_token_ms(t, rate[tenant], now)
      if next_token > s then
        score = next_token
      end
    end
    rcall('ZADD', due_key, score, tenant)
  end
  if tokens[tenant] then
    rate_save(tag, tenant, tokens[tenant], now)
  end
end
if #tenants > 0 then
  rcall('HSET', meta_key, 'hwm', now_text)
end
if #runs > 0 then
  event_emit(events_key, event_cap_for(event_cap, #runs / 2), 'e', 'dispatched',
    'at', now_text, 'node', node, 'epoch', epoch, 'runs', string.sub(table.concat(runs), 1, -2))
end

local counts, lags = {}, {}
for tenant, n in pairs(per_tenant) do
  counts[#counts + 1] = tenant
  counts[#counts + 1] = n
  lags[#lags + 1] = tenant
  lags[#lags + 1] = tenant_lag[tenant] or 0
end
local backlog = 0
if consumed >= limit then
  for i = 1, #tenants do
    backlog = backlog + rcall('ZCOUNT', tag .. 'near:' .. tenants[i], '-inf', now_text)
  end
end
if parked_now > 0 then  -- counted again only when this call parked runs
  still_parked, parked_pairs = park_counts(tag)
end
local promoted_until = wheel_promoted_until(meta_key)
return { dispatched, first_score(due_key), now, clock_back, first_score(tag .. 'wheel'),
  promoted_until, consumed, counts, lag_counts or {}, backlog, lag_sum, held, lags,
  still_parked, released, parked_pairs }
