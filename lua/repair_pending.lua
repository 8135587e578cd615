--[[ repair_pending: hand a delivered ready-stream entry that its group's pending list lost
  (an XACK that was not run_ack) back to the reaper (timewheel audit --repair;
  docs/operations/auditing.md).
  KEYS[1] stream  STREAM tag..'q:'..tenant..':'..queue (the tag is KEYS[1] up to '}:')
  ARGV[1] consumer group   ARGV[2] entry id   ARGV[3] run_id   ARGV[4] the attempt it is out
  with   ARGV[5] default visibility timeout ms   ARGV[6] min visibility timeout ms
  ARGV[7] consumer to hold it   ARGV[8] bucket_ms
  Derived keys (same tag): meta, t:<xy>, near:<tenant>, w:<bucket>, s:<sid>.
  Returns: {1}   back in the group's pending list, idle for the run's visibility timeout:
                 the reaper's next pass sends it through the retry policy (reason
                 lease_expired), as a delivery whose executor went away
           {0}   nothing done: the entry is gone, pending again, or its run moved on
  Errors:  none.
  XCLAIM ... FORCE makes the pending entry; nothing is deleted. ]]
local rcall = redis.call
local stream = KEYS[1]
local group, entry_id, run_id, attempt = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local default_vis, min_vis, consumer = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local bucket_ms = tonumber(ARGV[8])
local tag = string.match(stream, '^(.-}:)')

--!include lib/wheel.lua
--!include lib/audit.lua

if rcall('XRANGE', stream, entry_id, entry_id)[1] == nil
    or rcall('XPENDING', stream, group, entry_id, entry_id, 1)[1] ~= nil then
  return { 0 }
end
local r = audit_read(tag, run_id)
if r == nil or audit_sent_attempt(tag, run_id, r, wheel_promoted_until(tag .. 'meta'), bucket_ms) ~= attempt then
  return { 0 }
end
local idle = math.max(audit_visibility_ms(r, default_vis), min_vis)
rcall('XCLAIM', stream, group, consumer, 0, entry_id, 'IDLE', string.format('%d', idle),
  'FORCE', 'JUSTID')
return { 1 }
