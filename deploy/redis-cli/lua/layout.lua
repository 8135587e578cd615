-- The deployment's layout. KEYS[1] <prefix>:layout.
-- Answers: 'shards bucket_ms'.
local layout = redis.call('HMGET', KEYS[1], 'shards', 'bucket_ms')
if not layout[1] then
  return redis.error_reply('no timewheel deployment here: ' .. KEYS[1] .. ' does not exist '
    .. '(set TIMEWHEEL_PREFIX to the deployment\'s prefix)')
end
return { 'ok', tw_line(tw_int(layout[1]), tw_int(layout[2])) }
