-- settle.lua: settle a lease with what the call really used (the refund).
--
-- Credits reserved - used back to the bucket exactly once (negative when the
-- call overshot its reservation: the bucket then goes into debt and refuses
-- until refill repays it), adds used to spent, marks the lease settled and
-- keeps it as a tombstone for ARGV[2] ms so a retried settle is answered from
-- the record instead of refunding twice. Key layout: see policy.lua.
--
-- KEYS[1]  bucket hash   {rsv:<subject>:<route>}:bucket
-- KEYS[2]  lease hash    {rsv:<subject>:<route>}:lease:<id>
-- KEYS[3]  expiry zset   {rsv:<subject>:<route>}:expiry
-- ARGV[1]  reservation id
-- ARGV[2]  used units (integer >= 0)
-- ARGV[3]  tombstone TTL in ms (how long a settled lease answers retries)
--
-- Returns one of
--   {'SETTLED', amount, used, refund, replay}  replay = 1 for a repeated settle
--   {'CONFLICT', used_before}   settled before with another amount
--   {'INVALID_STATE', state}    swept after expiry
--   {'UNKNOWN'}                 no such lease
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n) return string.format('%.0f', n) end

local used = tonumber(ARGV[2])
if used == nil or used < 0 or used ~= math.floor(used) then
  return redis.error_reply('BAD_ARG settle: used must be an integer >= 0')
end
local tomb = tonumber(ARGV[3])
if tomb == nil or tomb < 1 then
  return redis.error_reply('BAD_ARG settle: tombstone TTL must be >= 1 ms')
end

local l = redis.call('HMGET', KEYS[2], 'state', 'amount', 'used', 'refund')
if not l[1] then
  return {'UNKNOWN'}
end
local state, amount = l[1], tonumber(l[2])
if state == 'settled' then
  if tonumber(l[3]) == used then
    return {'SETTLED', amount, used, tonumber(l[4]), 1}
  end
  return {'CONFLICT', tonumber(l[3])}
end
if state ~= 'held' and state ~= 'started' then
  return {'INVALID_STATE', state}
end

local refund = amount - used
redis.call('HINCRBY', KEYS[1], 'tokens', int(refund))
redis.call('HINCRBY', KEYS[1], 'held', int(-amount))
redis.call('HINCRBY', KEYS[1], 'spent', int(used))
redis.call('HSET', KEYS[2], 'state', 'settled', 'used', int(used),
  'refund', int(refund), 'settled_ms', int(now_ms()))
redis.call('PEXPIRE', KEYS[2], int(tomb))
redis.call('ZREM', KEYS[3], ARGV[1])
return {'SETTLED', amount, used, refund, 0}
