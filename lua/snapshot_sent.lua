--[[ snapshot_sent: which of a shard's runs whose records say scheduled were sent (a
  snapshot copies them as dispatched; timewheel/archive/snapshot.py).
  KEYS[1] meta    HASH   tag..'meta' (the shard tag is KEYS[1] minus 'meta')
  ARGV[1] .. ARGV[n]  run ids of that shard (n <= 500, so one call stays well under a
          millisecond: per run one HGET and at most four lookups)
  Derived keys (same tag): t:<xy>, near:<tenant>, meta, wheel, w:<bucket>, s:<sid>.
  Returns: {i, ...}   the 1-based positions in ARGV of the runs whose record is there, says
           scheduled and was sent (lib/record.lua, record_sent: in neither level of the
           wheel nor held back by its schedule); a run whose record is gone or says
           anything else is left out.
  Errors:  more than 500 run ids is an error reply.
  Read-only. ]]
local meta_key = KEYS[1]
local tag = string.sub(meta_key, 1, -5)

--!include lib/record.lua

if #ARGV > 500 then
  return redis.error_reply('ERR timewheel: snapshot_sent takes at most 500 run ids')
end
local sent = {}
for i = 1, #ARGV do
  local run_id = ARGV[i]
  local r = record_read(body_key(tag, run_id), run_id)
  if r and r[R_STATE] == ST_SCHEDULED and record_sent(tag, run_id, r) then
    sent[#sent + 1] = i
  end
end
return sent
