-- redis-seed.lua: creates `count` held leases with the ids redis-benchmark
-- generates for __rand_int__ (twelve decimal digits, zero-padded), so that its
-- start.lua and settle.lua runs over `-r <first + count>` find a lease behind
-- (almost) every id. Writes what reserve.lua writes for a HELD reservation:
-- the lease hash (same fields), its expiry-index entry, and the bucket's
-- tokens -> held move, so the books still balance (tokens may go negative:
-- the seeded leases were not admitted against the balance). Layout: see
-- crates/loadgen/lua/policy.lua.
--
-- KEYS[1]  bucket hash   {rsv:<subject>:<route>}:bucket (published)
-- KEYS[2]  expiry zset   {rsv:<subject>:<route>}:expiry
-- ARGV[1]  lease key prefix, e.g. "{rsv:tenant-2:chat}:lease:"
-- ARGV[2]  first id (integer)
-- ARGV[3]  count
-- ARGV[4]  units per lease
-- ARGV[5]  tenant recorded in the leases
--
-- Returns the number of leases written. Bounded work: callers batch `count`.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(redis.call('HGET', KEYS[1], 'hold_ttl_ms'))
if not ttl then
  return redis.error_reply('NO_POLICY: publish the bucket first')
end
local first, count, units = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local created = string.format('%.0f', now)
local expires = string.format('%.0f', now + ttl)
-- expiry entries go in 1000 at a time (a third faster than one ZADD a lease)
local z = {}
for i = first, first + count - 1 do
  local id = string.format('%012d', i)
  redis.call('HSET', ARGV[1] .. id, 'tenant', ARGV[5], 'amount', units,
    'state', 'held', 'created_ms', created, 'expires_ms', expires)
  z[#z + 1] = expires
  z[#z + 1] = id
  if #z >= 2000 then
    redis.call('ZADD', KEYS[2], unpack(z))
    z = {}
  end
end
if #z > 0 then
  redis.call('ZADD', KEYS[2], unpack(z))
end
local total = string.format('%.0f', tonumber(units) * count)
redis.call('HINCRBY', KEYS[1], 'tokens', '-' .. total)
redis.call('HINCRBY', KEYS[1], 'held', total)
return count
