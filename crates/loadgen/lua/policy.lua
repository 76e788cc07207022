-- policy.lua: publish the limits of one bucket (the Redis stand-in for
-- `POST /v1/policies`). Creates the bucket on the first publish.
--
-- Key layout shared by every script (one hash tag per subject and route, so the
-- bucket, its leases and its expiry index always live in the same hash slot and
-- one script can touch all of them atomically):
--   {rsv:<subject>:<route>}:bucket        hash: the bucket and its books
--   {rsv:<subject>:<route>}:lease:<id>    hash: one reservation (lease record)
--   {rsv:<subject>:<route>}:expiry        zset: lease id -> expires_ms
--
-- Bucket fields: tokens (available, may go negative after an overdraft),
-- ts (last refill, ms), opening, minted (refilled so far), held (units in live
-- leases), spent (settled usage), expired (units refunded by the sweeper), and
-- the limits below. The books balance after every script:
--   opening + minted = tokens + held + spent
--
-- KEYS[1]  bucket hash
-- ARGV[1]  generation (integer >= 1; a publish only takes effect if newer)
-- ARGV[2]  burst_units (ceiling of the bucket)
-- ARGV[3]  refill_units, added per ARGV[4] interval_ms
-- ARGV[5]  opening_units (balance of a new bucket)
-- ARGV[6]  max_reservation_units (larger requests are refused unconditionally)
-- ARGV[7]  hold_ttl_ms (lease lifetime before the sweeper may refund it)
--
-- Returns {'CREATED', generation}, {'UPDATED', generation} (a newer generation
-- replaces the limits; balance and books are kept) or {'STALE', current}.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function uint(s)
  local n = tonumber(s)
  if n == nil or n < 0 or n ~= math.floor(n) then return nil end
  return n
end

for i = 1, 7 do
  if uint(ARGV[i]) == nil then
    return redis.error_reply('BAD_ARG policy ARGV[' .. i .. ']')
  end
end
local gen = uint(ARGV[1])
if gen < 1 or uint(ARGV[3]) < 1 or uint(ARGV[4]) < 1 then
  return redis.error_reply('BAD_ARG policy: generation, refill and interval must be >= 1')
end

local limits = {'generation', ARGV[1], 'burst', ARGV[2], 'refill_units', ARGV[3],
  'interval_ms', ARGV[4], 'max_reservation', ARGV[6], 'hold_ttl_ms', ARGV[7]}
local cur = redis.call('HGET', KEYS[1], 'generation')
if not cur then
  redis.call('HSET', KEYS[1], 'tokens', ARGV[5], 'opening', ARGV[5], 'minted', 0,
    'held', 0, 'spent', 0, 'expired', 0, 'ts', string.format('%.0f', now_ms()),
    unpack(limits))
  return {'CREATED', gen}
end
if gen <= tonumber(cur) then
  return {'STALE', tonumber(cur)}
end
redis.call('HSET', KEYS[1], unpack(limits))
return {'UPDATED', gen}
