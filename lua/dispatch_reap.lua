--[[ dispatch_reap: runs whose executor lease (visibility timeout) expired become failed attempts.
  KEYS[1] meta    HASH   tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] groups  SET    tag..'groups', members '<group>|<stream key>' (added by workers)
  KEYS[3] events  STREAM tag..'events'
  ARGV[1] node ('' = unfenced)   ARGV[2] epoch   ARGV[3] min_idle_ms: the shortest
          visibility timeout allowed (entries idle less are never expired)
  ARGV[4] default visibility timeout ms   ARGV[5] limit: most pending entries examined
          per stream and call (<= 1000: XPENDING and XRANGE stay short); a stream with
          more is examined across calls from a cursor in meta ('reap:<group>|<stream>')
  ARGV[6] rand seed in [0, 1)   ARGV[7] retry defaults JSON   ARGV[8] bucket_ms
  ARGV[9] now_ms override ('' = TIME)   ARGV[10] event log cap
  Derived keys (same tag): the streams named in KEYS[2], t:<xy>, near:<tenant>, due,
  w:<bucket>, wheel, dead:<tenant>, lease, and s:<sid> of a schedule's run (record_sent).
  Returns: {retried, buried, examined}
  Errors:  {-3} LEASE_LOST.
  A pending entry idle for longer than its run's visibility timeout (the task's own
  visibility_timeout_s, else the default) belonged to an executor that crashed or hung
  without heartbeating: it is acknowledged and deleted, and the run goes through the
  same retry policy as a failure (reason lease_expired). Executors extend their lease by
  XCLAIM ... JUSTID, which resets the idle time. A registered group missing from its
  stream (NOGROUP) is passed over: the executor makes it again, and registers it again
  (SADD), when it next reads, and this call sees it from then on. ]]
local rcall = redis.call
local meta_key, groups_key, events_key = KEYS[1], KEYS[2], KEYS[3]
local node, epoch, min_idle = ARGV[1], ARGV[2], tonumber(ARGV[3])
local default_vis, limit, seed = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local defaults, bucket_ms = cjson.decode(ARGV[7]), tonumber(ARGV[8])
local now_override, event_cap = ARGV[9], ARGV[10]
local tag = string.sub(meta_key, 1, -5)

--!include lib/hash.lua
--!include lib/record.lua
--!include lib/delivery.lua
--!include lib/clock.lua
--!include lib/retry.lua
--!include lib/lease.lua

if not lease_holds(tag, node, epoch) then
  return { -3 }
end
local now = clock_now_ms(now_override)

-- One jitter draw per reaped run from the caller's seed (a small LCG).
local state = math.floor(seed * 2147483647)
local function next_rand()
  state = (1103515245 * state + 12345) % 2147483648
  return state / 2147483648
end

local function visibility_ms(r)
  if r[R_OPTS] then
    local opts = cjson.decode(r[R_OPTS])
    if opts.visibility_timeout_s then
      return opts.visibility_timeout_s * 1000
    end
  end
  return default_vis
end

local retried, buried, examined = 0, 0, 0
for _, member in ipairs(rcall('SMEMBERS', groups_key)) do
  local group, stream = string.match(member, '^([^|]+)|(.+)$')
  if group and rcall('EXISTS', stream) == 1 then
    -- Resume after the last entry examined (meta field 'reap:<member>'): entries idle
    -- past min_idle but inside their own longer timeout cannot hide later ones.
    local cursor_field = 'reap:' .. member
    local after = rcall('HGET', meta_key, cursor_field)
    local start = '-'
    if after then
      start = '(' .. after
    end
    -- The group may be gone while its stream is back (a restore, a failover to a
    -- replica that had not seen it, a deleted stream the tick wrote again): it has
    -- nothing pending then, and its executor makes it again at its next read.
    local pending = redis.pcall('XPENDING', stream, group, 'IDLE', min_idle, start, '+', limit)
    if type(pending) == 'table' and pending.err then
      pending = {}
    end
    if #pending < limit then
      rcall('HDEL', meta_key, cursor_field)
    else
      rcall('HSET', meta_key, cursor_field, pending[#pending][1])
    end
    for _, p in ipairs(pending) do
      examined = examined + 1
      local entry_id, idle = p[1], tonumber(p[3])
      local entry = rcall('XRANGE', stream, entry_id, entry_id)[1]
      if entry == nil then
        rcall('XACK', stream, group, entry_id)  -- deleted already: forget it
      else
        local f = hash_table(entry[2])
        local run_id = f['run_id']
        local r, bkey = record_find(tag, run_id)
        if not (r and delivery_live(r, tonumber(f['attempt']))) then
          delivery_done(stream, group, entry_id)
        elseif idle >= visibility_ms(r) then
          delivery_done(stream, group, entry_id)
          local outcome = retry_or_bury(tag, bkey, run_id, r, {
            now = now, defaults = defaults, error = 'lease expired after ' .. idle .. ' ms',
            reason = 'lease_expired', permanent = false, delay_ms = nil, rand = next_rand(),
            bucket_ms = bucket_ms, events_key = events_key, event_cap = event_cap,
          })
          if outcome == 'retry' then
            retried = retried + 1
          else
            buried = buried + 1
          end
        end
      end
    end
  end
end
return { retried, buried, examined }
