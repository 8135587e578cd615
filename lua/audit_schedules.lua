--[[ audit_schedules: check a shard's schedules, one bounded step at a time (read only;
  docs/operations/auditing.md).
  KEYS[1] schedules  SET tag..'schedules' (the tag is KEYS[1] minus 'schedules')
  ARGV[1] SSCAN cursor ('0' = from the start)   ARGV[2] limit: schedules per call (<= 500)
  ARGV[3] now_ms override ('' = TIME)   ARGV[4] overdue_ms
  Derived keys (same tag): meta, s:<sid>, plan:<tenant>, plan_tenants, plan, lease.
  Returns: {cursor, examined, findings...}   cursor '0' once every schedule is read;
           findings 6 values each, as audit_records.
  Errors:  none.
  Checks: an active schedule is in its tenant's plan index at its next fire time to plan,
  and its tenant in plan_tenants no later (schedule_unindexed; one still in the index of
  an earlier library version is waiting for schedule_due to move it, and is fine); that
  next fire time is not past by more than overdue_ms (schedule_overdue, with why). An
  ended schedule is explained by max_runs reached or an end_at; one that is neither comes
  back as schedule_ended_silently with its spec and cursor (data: cursor, detail: the spec
  JSON), for the caller to see whether the spec has a fire time left. ]]
local rcall = redis.call
local schedules_key = KEYS[1]
local cursor, limit, now_override = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local overdue_ms = tonumber(ARGV[4])
local tag = string.sub(schedules_key, 1, -10)

--!include lib/clock.lua
--!include lib/schedule.lua
--!include lib/audit.lua

local out = { '0', 0 }
local now = clock_shard_ms(tag .. 'meta', now_override)
local owned = rcall('EXISTS', tag .. 'lease') == 1

local function check_active(sid, tenant, next_ms)
  local score = tonumber(rcall('ZSCORE', tag .. 'plan:' .. tenant, sid))
  if score == nil then
    if not rcall('ZSCORE', tag .. 'plan', sid) then
      audit_add(out, 'schedule_unindexed', tenant, sid, '', string.format(
        'active, next fire time %d, but not in plan:%s: the planner never extends it',
        next_ms, tenant))
    end
    return
  end
  if score ~= next_ms then
    audit_add(out, 'schedule_unindexed', tenant, sid, '', string.format(
      'in plan:%s at %d but its next fire time to plan is %d', tenant, score, next_ms))
  end
  local head = tonumber(rcall('ZSCORE', tag .. 'plan_tenants', tenant))
  if head == nil or head > score then
    audit_add(out, 'schedule_unindexed', tenant, sid, '', 'its tenant is missing from '
      .. 'plan_tenants, or later there than this schedule: the planner does not visit it')
  end
  if next_ms >= 0 and next_ms < now - overdue_ms then
    audit_add(out, 'schedule_overdue', tenant, sid, owned and 'unknown' or 'unowned',
      string.format('its next fire time %d is %d ms past and not planned', next_ms,
        now - next_ms))
  end
end

local function explained(s)
  local max_runs, planned = tonumber(s[4]) or 0, tonumber(s[5]) or 0
  if max_runs > 0 and planned >= max_runs then
    return true
  end
  local ok, spec = pcall(cjson.decode, s[6] or '')
  return ok and type(spec) == 'table' and tonumber(spec.end_ms) ~= nil
end

local reply = rcall('SSCAN', schedules_key, cursor, 'COUNT', limit)
for _, sid in ipairs(reply[2]) do
  local s = rcall('HMGET', schedule_key(tag, sid), 'tenant', 'state', 'next_ms', 'max_runs',
    'planned', 'spec', 'cursor')
  local tenant, state = s[1], s[2]
  if tenant and state == 'active' then
    check_active(sid, tenant, tonumber(s[3]) or -1)
  elseif tenant and state == 'ended' and not explained(s) then
    audit_add(out, 'schedule_ended_silently', tenant, sid, '', s[6] or '', s[7] or '')
  end
end
out[1], out[2] = reply[1], #reply[2]
return out
