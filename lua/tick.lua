--[[ tick: dispatch due runs of one shard into their ready streams, tenants in turn.
  KEYS[1] meta    HASH   tag..'meta' (fields hwm, promoted_until; the tag is KEYS[1] minus 'meta')
  KEYS[2] due     ZSET   tag..'due', tenant -> earliest near due_ms
  KEYS[3] events  STREAM tag..'events'
  ARGV[1] limit: most runs to dispatch in this call (<= 5000: one call blocks Redis
          for about 10 us per run, so 1000 keeps a tick near 10 ms)
  ARGV[2] now_ms override ('' = TIME)   ARGV[3] node ('' = unfenced)   ARGV[4] epoch
  ARGV[5] event log cap   ARGV[6] misfire_ms   ARGV[7] bucket_ms
  Derived keys (same tag): near:<tenant>, t:<xy>, q:<tenant>:<queue>, lease, wheel,
  dead:<tenant> (a run past its expires_at is dead-lettered, reason expired, not sent),
  s:<sid>, sr:<sid>, x:<bucket>, expiry (a schedule's run may be skipped: misfire past
  misfire_ms under its catchup policy, or overlap; see lib/schedule.lua).
  Returns: {dispatched, next_due_ms, now_ms, clock_back_ms, next_bucket_ms, promoted_until,
           consumed, {tenant, count, ...}, {lag_ms, ...}, backlog}
           next_due_ms / next_bucket_ms are -1 when nothing waits; consumed (near entries
           taken, stale ones included) = limit means more may be due now; the lists give
           runs dispatched per tenant and each run's lag (now - due_ms) for metrics;
           backlog counts runs still due after this call (0 unless consumed = limit).
  Errors:  {-3} LEASE_LOST: ARGV[3] no longer holds the shard at epoch ARGV[4].
  Fairness: deficit round robin with unit cost. Each round gives every tenant with due
  runs an equal share of what is left of the limit, so one tenant's backlog due in the
  same second takes its turn and cannot hold back another tenant's runs.
  Clock: now = max(TIME, hwm). A clock that steps back neither re-opens a window nor
  delays runs already due by the high-water mark; clock_back_ms reports the step. ]]
local rcall = redis.call
local meta_key, due_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local limit, now_override, node, epoch = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
local event_cap, misfire_ms, bucket_ms = ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/clock.lua
--!include lib/wheel.lua
--!include lib/events.lua
--!include lib/schedule.lua
--!include lib/retry.lua
--!include lib/lease.lua

if not lease_holds(tag, node, epoch) then
  return { -3 }
end

local now = clock_now_ms(now_override)
local hwm = tonumber(rcall('HGET', meta_key, 'hwm')) or 0
local clock_back = 0
if now < hwm then
  clock_back = hwm - now
  now = hwm
end

local sched_ctx = { tag = tag, now = now, bucket_ms = bucket_ms, misfire_ms = misfire_ms,
  events_key = events_key, event_cap = event_cap, sent = {} }

local function first_score(key)
  local first = rcall('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] == nil then
    return -1
  end
  return tonumber(first[2])
end

-- Per call, not per run: Redis would format now with '%.14g' on every XADD.
local now_text = string.format('%d', now)

-- Dispatch one run; returns 'id:attempt' for the event log, or nil if the near entry
-- was stale (its body gone or no longer scheduled).
local lags = {}
local function dispatch(tenant, run_id)
  local bkey = body_key(tag, run_id)
  local r = record_read(bkey, run_id)
  if r == nil or r[R_STATE] ~= ST_SCHEDULED then
    return nil
  end
  if r[R_OPTS] and string.find(r[R_OPTS], 'expires_at_ms', 1, true) then
    local expires = cjson.decode(r[R_OPTS]).expires_at_ms
    if expires and now > expires then
      retry_or_bury(tag, bkey, run_id, r, { now = now, defaults = {}, permanent = true,
        error = 'not dispatched before expires_at', reason = 'expired',
        events_key = events_key, event_cap = event_cap, bucket_ms = bucket_ms })
      return nil
    end
  end
  if r[R_SCHEDULE] and not schedule_admit(sched_ctx, bkey, run_id, r) then
    return nil
  end
  local attempt = r[R_ATTEMPT] + 1
  local stream = tag .. 'q:' .. tenant .. ':' .. r[R_QUEUE]
  local entry = { 'run_id', run_id, 'task_id', string.match(run_id, '^[^@]+') }
  if r[R_SCHEDULE] then
    entry[#entry + 1], entry[#entry + 2] = 'schedule_id', r[R_SCHEDULE]
  end
  local n = #entry
  entry[n + 1], entry[n + 2], entry[n + 3], entry[n + 4] = 'tenant', tenant, 'queue', r[R_QUEUE]
  entry[n + 5], entry[n + 6], entry[n + 7], entry[n + 8] = 'attempt', attempt, 'due_ms', r[R_DUE]
  entry[n + 9], entry[n + 10], entry[n + 11], entry[n + 12] = 'dispatched_ms', now_text,
    'payload', r[R_PAYLOAD]
  if r[R_OPTS] and string.find(r[R_OPTS], 'visibility_timeout_s', 1, true) then
    -- Only a task with its own visibility timeout carries it, for the executor's heartbeat.
    entry[n + 13] = 'visibility_timeout_ms'
    entry[n + 14] = math.floor(cjson.decode(r[R_OPTS]).visibility_timeout_s * 1000)
  end
  rcall('XADD', stream, '*', unpack(entry))
  lags[#lags + 1] = now - r[R_DUE]
  -- The record is not rewritten: leaving the near level (serve, below) is what makes
  -- the run dispatched (record_sent in lib/record.lua).
  if r[R_SCHEDULE] then
    sched_ctx.sent[run_id] = true  -- still in the near level until serve's batch ends
  end
  return run_id .. ':' .. attempt
end

-- Serve up to n due runs of one tenant; returns near entries consumed, runs dispatched.
-- All runs of the call go into one 'dispatched' event (runs = 'id:attempt,...'): one
-- XADD per tick instead of one per tenant served.
local per_tenant, runs = {}, {}
local function serve(tenant, n)
  local near = tag .. 'near:' .. tenant
  local ids = rcall('ZRANGE', near, '-inf', now, 'BYSCORE', 'LIMIT', 0, n)
  if #ids == 0 then
    return 0, 0
  end
  local sent = 0
  for i = 1, #ids do
    local done = dispatch(tenant, ids[i])
    if done then
      runs[#runs + 1] = done
      sent = sent + 1
    end
  end
  -- ids are the lowest-scored members, so they are exactly ranks 0 .. #ids-1.
  rcall('ZREMRANGEBYRANK', near, 0, #ids - 1)
  if sent > 0 then
    per_tenant[tenant] = (per_tenant[tenant] or 0) + sent
  end
  return #ids, sent
end

local tenants = rcall('ZRANGE', due_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
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
    local want = math.min(share, budget)
    local got, sent = serve(active[i], want)
    budget = budget - got
    consumed = consumed + got
    dispatched = dispatched + sent
    if got == want then
      still[#still + 1] = active[i]
    end
  end
  active = still
end

-- Repair each served tenant's entry in the due index to its earliest remaining run.
for i = 1, #tenants do
  local s = first_score(tag .. 'near:' .. tenants[i])
  if s < 0 then
    rcall('ZREM', due_key, tenants[i])
  else
    rcall('ZADD', due_key, s, tenants[i])
  end
end
if #tenants > 0 then
  rcall('HSET', meta_key, 'hwm', now)
end
if #runs > 0 then
  event_emit(events_key, event_cap, 'e', 'dispatched', 'at', now_text, 'node', node,
    'epoch', epoch, 'runs', table.concat(runs, ','))
end

local counts = {}
for tenant, n in pairs(per_tenant) do
  counts[#counts + 1] = tenant
  counts[#counts + 1] = n
end
local backlog = 0
if consumed >= limit then
  for i = 1, #tenants do
    backlog = backlog + rcall('ZCOUNT', tag .. 'near:' .. tenants[i], '-inf', now)
  end
end
local promoted_until = tonumber(rcall('HGET', meta_key, 'promoted_until')) or 0
return { dispatched, first_score(due_key), now, clock_back, first_score(tag .. 'wheel'),
  promoted_until, consumed, counts, lags, backlog }
