-- sweep.lua: refund leases that outlived their hold TTL (the background
-- sweeper of the design). A process killed between reserve and settle would
-- otherwise leak its hold forever. Held and started leases alike are refunded
-- in full, marked expired and kept as tombstones; a late start or settle then
-- gets INVALID_STATE. Key layout: see policy.lua.
--
-- The lease keys are built from ARGV[1] rather than passed in KEYS (their ids
-- are only known from the zset). They share the bucket's hash tag, so they live
-- in the same slot; this is fine on a single Redis, and is the documented
-- caveat for Redis Cluster.
--
-- It refunds `amount` to KEYS[1] only: it does not know the further buckets of
-- a reserve_dims.lua lease (there is no sweep for those yet).
--
-- KEYS[1]  bucket hash   {rsv:<subject>:<route>}:bucket
-- KEYS[2]  expiry zset   {rsv:<subject>:<route>}:expiry
-- ARGV[1]  lease key prefix, e.g. "{rsv:tenant-1:chat}:lease:"
-- ARGV[2]  at most this many leases per call (bounded work per script)
-- ARGV[3]  tombstone TTL in ms
--
-- Returns {leases_swept, units_refunded}.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n) return string.format('%.0f', n) end

local limit = tonumber(ARGV[2])
local tomb = tonumber(ARGV[3])
if limit == nil or limit < 1 or tomb == nil or tomb < 1 then
  return redis.error_reply('BAD_ARG sweep: limit and tombstone TTL must be >= 1')
end
local now = now_ms()
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', int(now), 'LIMIT', 0, int(limit))
local swept, units = 0, 0
for _, id in ipairs(ids) do
  local key = ARGV[1] .. id
  local l = redis.call('HMGET', key, 'state', 'amount')
  if l[1] == 'held' or l[1] == 'started' then
    local amount = tonumber(l[2])
    redis.call('HINCRBY', KEYS[1], 'tokens', int(amount))
    redis.call('HINCRBY', KEYS[1], 'held', int(-amount))
    redis.call('HINCRBY', KEYS[1], 'expired', int(amount))
    redis.call('HSET', key, 'state', 'expired', 'expired_ms', int(now))
    redis.call('PEXPIRE', key, int(tomb))
    swept = swept + 1
    units = units + amount
  end
  redis.call('ZREM', KEYS[2], id)
end
return {swept, units}
