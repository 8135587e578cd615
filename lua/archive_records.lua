--[[ archive_records: the stored records of some of a shard's runs, for the archiver to
  take payloads and options from (timewheel/archive/archiver.py): one call per shard
  and round instead of an HGET per run.
  KEYS[1] meta    HASH   tag..'meta' (the shard tag is KEYS[1] minus 'meta')
  ARGV[1] .. ARGV[n]  run ids of that shard (n <= 1000: one HGET each, so a call stays
          well under a millisecond)
  Derived keys (same tag): t:<xy>.
  Returns: {raw | false, ...}   each run's record as stored (lib/record.lua), in ARGV
           order; false where the record is gone.
  Errors:  more than 1000 run ids is an error reply.
  Read-only. ]]
local tag = string.sub(KEYS[1], 1, -5)

--!include lib/bodies.lua
--!include lib/record.lua

if #ARGV > 1000 then
  return redis.error_reply('ERR timewheel: archive_records takes at most 1000 run ids')
end
local out = {}
for i = 1, #ARGV do
  local run_id = ARGV[i]
  out[i] = redis.call('HGET', body_key(tag, run_id), body_field(run_id)) or false
end
return out
