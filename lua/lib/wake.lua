-- Waking the scheduler. It sleeps until a shard's next action is due; a call that makes
-- a run the shard's next action (wheel_place or schedule_run_finished returned 1) tells
-- it at once, on the deployment's wake channel, so it need not poll.
--
--   wake_publish(woken, channel, shard)  PUBLISH shard (the message: the shard number)
--       on channel when woken is 1; a caller with no channel ('' or nil) sends nothing.
local function wake_publish(woken, channel, shard)
  if woken == 1 and channel and channel ~= '' then
    redis.call('PUBLISH', channel, shard)
  end
end
