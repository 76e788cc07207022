-- settle_dims.lua: settle a lease of reserve_dims.lua with what the call used
-- in every dimension (requests 1, input as the provider reported it, output
-- as reported), in one atomic step.
--
-- Per dimension, as the Reservoir core settles (buckets.rs, settle_split):
-- used <= held refunds held - used; used > held draws the excess from the
-- available tokens, and what they lack becomes debt (tokens < 0), counted in
-- the bucket's `overdraft`, and refused against until refill repays it. The
-- books of each bucket stay balanced: opening + minted = tokens + held + spent.
-- The lease is marked settled and kept as a tombstone for ARGV[2] ms, so a
-- retried settle is answered from the record instead of refunding twice.
-- Lease fields: `used`/`refund` for dimension 1, `used_<i>`/`refund_<i>` for i > 1.
--
-- KEYS[1..n]  bucket hash of each dimension, in the order the reserve used
-- KEYS[n+1]   lease hash    {rsv:S:R}:lease:<id>
-- KEYS[n+2]   expiry zset   {rsv:S:R}:expiry
-- ARGV[1]     reservation id
-- ARGV[2]     tombstone TTL in ms
-- ARGV[3..]   used units in dimension 1..n (integers >= 0)
--
-- Returns one of
--   {'SETTLED', replay, refund_1, ..., refund_n}  replay = 1 for a repeated settle;
--                                                 a negative refund is an extra charge
--   {'CONFLICT', i, used_before_i}  settled before with other usage
--   {'INVALID_STATE', state}        swept after expiry
--   {'WRONG_DIMS', dims}            the lease holds another number of dimensions
--   {'UNKNOWN'}                     no such lease
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n) return string.format('%.0f', n) end
local function name(base, i) if i == 1 then return base end return base .. '_' .. i end

local n = #KEYS - 2
if n < 1 or #ARGV ~= n + 2 then
  return redis.error_reply('BAD_ARG settle_dims: n buckets + lease + expiry keys, id + TTL + n used')
end
local lease_key, expiry_key = KEYS[n + 1], KEYS[n + 2]
local tomb = tonumber(ARGV[2])
if tomb == nil or tomb < 1 then
  return redis.error_reply('BAD_ARG settle_dims: tombstone TTL must be >= 1 ms')
end
local used = {}
for i = 1, n do
  local u = tonumber(ARGV[i + 2])
  if u == nil or u < 0 or u ~= math.floor(u) then
    return redis.error_reply('BAD_ARG settle_dims: used units of dimension ' .. i)
  end
  used[i] = u
end

local l = redis.call('HMGET', lease_key, 'state', 'dims')
if not l[1] then return {'UNKNOWN'} end
if tonumber(l[2] or '1') ~= n then return {'WRONG_DIMS', tonumber(l[2] or '1')} end
local state = l[1]
if state == 'settled' then
  local reply = {'SETTLED', 1}
  for i = 1, n do
    local before = tonumber(redis.call('HGET', lease_key, name('used', i)))
    if before ~= used[i] then return {'CONFLICT', i, before} end
    reply[#reply + 1] = tonumber(redis.call('HGET', lease_key, name('refund', i)))
  end
  return reply
end
if state ~= 'held' and state ~= 'started' then
  return {'INVALID_STATE', state}
end

local record = {'state', 'settled', 'settled_ms', int(now_ms())}
local reply = {'SETTLED', 0}
for i = 1, n do
  local amount = tonumber(redis.call('HGET', lease_key, name('amount', i)))
  local refund = amount - used[i]
  if refund < 0 then
    -- The excess beyond what is available now is debt (the core's overdraft).
    local tokens = tonumber(redis.call('HGET', KEYS[i], 'tokens'))
    local over = -refund - math.max(tokens, 0)
    if over > 0 then redis.call('HINCRBY', KEYS[i], 'overdraft', int(over)) end
  end
  redis.call('HINCRBY', KEYS[i], 'tokens', int(refund))
  redis.call('HINCRBY', KEYS[i], 'held', int(-amount))
  redis.call('HINCRBY', KEYS[i], 'spent', int(used[i]))
  record[#record + 1] = name('used', i)
  record[#record + 1] = int(used[i])
  record[#record + 1] = name('refund', i)
  record[#record + 1] = int(refund)
  reply[#reply + 1] = refund
end
redis.call('HSET', lease_key, unpack(record))
redis.call('PEXPIRE', lease_key, int(tomb))
redis.call('ZREM', expiry_key, ARGV[1])
return reply
