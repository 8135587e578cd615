--[[ audit_stream: check ready streams of one shard, one bounded step of entries at a time,
  against their runs' records and their consumer groups (docs/operations/auditing.md).
  KEYS[1] scratch  HASH tag..'audit:'..pass (audit_records): a run whose entry is found at
                   the attempt it is out with is taken off it, and each stream read gets a
                   field '~'..stream (audit_confirm judges only runs of streams read); its
                   TTL is set to ARGV[7]
  KEYS[2 ..] stream  STREAM tag..'q:'..tenant..':'..queue, each of the same shard (the tag
                   is KEYS[1] up to '}:'), read in order
  ARGV[1] where to go on in KEYS[2]: '<last entry id read> <last entry id to read>', as a
          previous call answered ('' = from its start, where its groups are checked)
  ARGV[2] limit: entries per call (<= 500)
  ARGV[3] default visibility timeout ms   ARGV[4] min visibility timeout ms
  ARGV[5] grace ms: how long past its visibility timeout a pending entry may wait for the
          reaper   ARGV[6] bucket_ms   ARGV[7] scratch TTL ms
  Derived keys (same tag): meta, t:<xy>, near:<tenant>, w:<bucket>, s:<sid>, groups, lease.
  Returns: {done, cursor, examined, findings...}   done: how many streams were read to
           their end; cursor: where to go on in the next one, for ARGV[1] ('' = its start);
           findings 6 values each, as audit_records. A stream is read up to the entry that
           was its last when its reading began.
  Errors:  none.
  Checks: every entry belongs to a run out (dispatched) at the entry's attempt, in this
  stream (record_missing, stream_entry_orphan); an entry a consumer group has delivered
  (its id at or before the group's last-delivered-id) is in that group's pending list
  (delivered_not_pending: an XACK that was not run_ack leaves it there for good); no
  pending entry is idle past its run's visibility timeout plus the grace
  (lease_expired_unreaped); every group is in the shard's groups set, which the reaper
  reads (group_unwatched). ]]
local rcall = redis.call
local scratch_key = KEYS[1]
local after, limit, default_vis = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local min_vis, grace_ms, bucket_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local scratch_ttl = ARGV[7]
local tag = string.match(scratch_key, '^(.-}:)')

--!include lib/hash.lua
--!include lib/record.lua
--!include lib/wheel.lua
--!include lib/audit.lua

local out = { 0, '', 0 }
local groups_key = tag .. 'groups'
local owned = rcall('EXISTS', tag .. 'lease') == 1
local promoted = wheel_promoted_until(tag .. 'meta')
local wrote = false

local function state_text(r)
  return string.format('state %d at attempt %d', r[R_STATE], r[R_ATTEMPT])
end

-- A stream's consumer groups; from its start, those the reaper does not know are findings.
local function stream_groups(stream, tenant, from_start)
  local groups = {}
  for _, info in ipairs(rcall('XINFO', 'GROUPS', stream)) do
    local g = hash_table(info)
    local watched = rcall('SISMEMBER', groups_key, g['name'] .. '|' .. stream) == 1
    groups[#groups + 1] = { name = g['name'], last = g['last-delivered-id'], watched = watched }
    if from_start and not watched then
      audit_add(out, 'group_unwatched', tenant, stream, '', 'consumer group ' .. g['name']
        .. ' is not in ' .. groups_key .. ': the reaper never looks at its pending entries',
        g['name'])
    end
  end
  return groups
end

local function check_groups(stream, groups, tenant, id, run_id, r, attempt)
  for _, g in ipairs(groups) do
    if not audit_id_after(id, g.last) then
      local p = rcall('XPENDING', stream, g.name, id, id, 1)[1]
      if p == nil then
        audit_add(out, 'delivered_not_pending', tenant, run_id, '', 'entry ' .. id
          .. ' was delivered to group ' .. g.name .. ' but is not in its pending list',
          g.name .. '|' .. id .. '|' .. string.format('%d', attempt) .. '|' .. stream)
      else
        local idle = tonumber(p[3])
        local allowed = math.max(audit_visibility_ms(r, default_vis), min_vis) + grace_ms
        if idle > allowed then
          local reason = 'unknown'
          if not owned then
            reason = 'unowned'
          elseif not g.watched then
            reason = 'unwatched'
          end
          audit_add(out, 'lease_expired_unreaped', tenant, run_id, reason, string.format(
            'entry %s pending in group %s for %d ms (consumer %s): past its visibility '
            .. 'timeout and the grace (%d ms)', id, g.name, idle, p[2], allowed))
        end
      end
    end
  end
end

local function check_entry(stream, groups, tenant, queue, id, fields)
  local f = hash_table(fields)
  local run_id, attempt = f['run_id'], tonumber(f['attempt'])
  local r, raw
  if run_id then
    r, raw = audit_read(tag, run_id)
  end
  if r == nil then
    if raw == nil then
      audit_add(out, 'record_missing', tenant, run_id or id, '', 'entry ' .. id .. ' of '
        .. stream .. ' names a run that has no record')
    end  -- a record that does not decode: audit_records reports it
  elseif r[R_TENANT] ~= tenant or r[R_QUEUE] ~= queue then
    audit_add(out, 'stream_entry_orphan', tenant, run_id, '', 'entry ' .. id
      .. ' is in the stream of another tenant or queue than its run (' .. r[R_TENANT] .. ':'
      .. r[R_QUEUE] .. ')')
  elseif audit_sent_attempt(tag, run_id, r, promoted, bucket_ms) ~= attempt then
    audit_add(out, 'stream_entry_orphan', tenant, run_id, '', 'entry ' .. id
      .. ' is of attempt ' .. tostring(f['attempt']) .. ' but the run is not out at it ('
      .. state_text(r) .. ')')
  else
    rcall('HDEL', scratch_key, run_id)
    wrote = true
    check_groups(stream, groups, tenant, id, run_id, r, attempt)
  end
end

-- A stream is read up to the entry that was its last when its reading began: entries
-- added since are of runs sent after audit_records read them, and a stream that grows
-- faster than it is read still ends.
local done, examined, upto = 0, 0, nil
if after ~= '' then
  after, upto = string.match(after, '^([^ ]+) (.+)$')
end
while done < #KEYS - 1 and examined < limit do
  local stream = KEYS[done + 2]
  local entries = {}
  if rcall('EXISTS', stream) == 1 then
    local tenant, queue = string.match(string.sub(stream, #tag + 3), '^([^:]+):(.*)$')
    local groups = stream_groups(stream, tenant, after == '')
    if after == '' then
      rcall('HSET', scratch_key, '~' .. stream, '1')
      wrote = true
    end
    if upto == nil then
      local last = rcall('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
      upto = last and last[1]
    end
    if upto ~= nil then
      local start = after == '' and '-' or '(' .. after
      entries = rcall('XRANGE', stream, start, upto, 'COUNT', limit - examined)
      for _, e in ipairs(entries) do
        check_entry(stream, groups, tenant, queue, e[1], e[2])
      end
    end
  end
  examined = examined + #entries
  if #entries > 0 and examined >= limit and entries[#entries][1] ~= upto then
    after = entries[#entries][1]  -- the limit stopped it: go on after the last one read
  else
    done, after, upto = done + 1, '', nil
  end
end
if wrote then
  rcall('PEXPIRE', scratch_key, scratch_ttl)
end
if after ~= '' then
  after = after .. ' ' .. upto
end
out[1], out[2], out[3] = done, after, examined
return out
