--[[ audit_confirm: judge the runs left in an audit pass's scratch hash: found out
  (dispatched) by audit_records, and whose entry no audit_stream call found since
  (docs/operations/auditing.md).
  KEYS[1] meta     HASH tag..'meta' (the tag is KEYS[1] minus 'meta')
  KEYS[2] scratch  HASH tag..'audit:'..pass, run id -> attempt, and '~'..stream for each
                   stream audit_stream read; deleted once read to its end
  ARGV[1] HSCAN cursor ('0' = from the start)   ARGV[2] limit: runs per call (<= 500)
  ARGV[3] bucket_ms
  Derived keys (same tag): t:<xy>, near:<tenant>, w:<bucket>, s:<sid>.
  Returns: {cursor, examined, findings...}   cursor '0' once every run is judged;
           findings 6 values each, as audit_records.
  Errors:  none.
  A run still out at the same attempt was out all along: every script that deletes a
  ready-stream entry changes the run's record in the same call, so its entry, had there
  been one, was in the stream while audit_stream read it. It has none: a scheduled run due
  at or after promoted_until is missing from the wheel (not_in_wheel), any other is out
  with no entry for an executor to get (dispatched_without_entry). A run that moved on
  since (acknowledged, retried) is left alone, and so is a run of a stream that exists
  but the pass did not read (created after the pass listed the shard's keys: its entry
  may be there; the next pass judges it). ]]
local rcall = redis.call
local meta_key, scratch_key = KEYS[1], KEYS[2]
local cursor, limit, bucket_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua
--!include lib/wheel.lua
--!include lib/audit.lua

local out = { '0', 0 }
local promoted = wheel_promoted_until(meta_key)
local next_cursor, flat = audit_scan(scratch_key, cursor, limit)
local examined = 0
for i = 1, #flat, 2 do
  local run_id, attempt = flat[i], tonumber(flat[i + 1])
  local r
  if string.byte(run_id, 1) ~= 126 then  -- '~': a stream read, not a run
    examined = examined + 1
    r = audit_read(tag, run_id)
  end
  local stream = r and tag .. 'q:' .. r[R_TENANT] .. ':' .. r[R_QUEUE]
  if r and audit_sent_attempt(tag, run_id, r, promoted, bucket_ms) == attempt
      and (rcall('HEXISTS', scratch_key, '~' .. stream) == 1
        or rcall('EXISTS', stream) == 0) then
    local tenant = r[R_TENANT]
    if r[R_STATE] == ST_SCHEDULED and r[R_DUE] >= promoted then
      audit_add(out, 'not_in_wheel', tenant, run_id, '', string.format(
        'scheduled, due %d (promoted_until %d), in no level of the wheel and not in %s',
        r[R_DUE], promoted, stream), string.format('%d', r[R_ATTEMPT]))
    else
      audit_add(out, 'dispatched_without_entry', tenant, run_id, '', string.format(
        'out at attempt %d with no entry in %s: no executor can get it', attempt, stream),
        string.format('%d', attempt))
    end
  end
end
if next_cursor == '0' then
  rcall('DEL', scratch_key)
end
out[1], out[2] = next_cursor, examined
return out
