-- reserve.lua: admit a request and hold its capacity, in one atomic step.
--
-- The single-script design: refill the bucket from the time elapsed, check it,
-- debit it and write the lease record (tenant, amount held, expiry) beside it in
-- the same hash slot. Idempotent on the reservation id: a retry with the same
-- amount returns the existing lease and debits nothing; a retry with another
-- amount is a conflict. Key layout and books: see policy.lua.
--
-- KEYS[1]  bucket hash   {rsv:<subject>:<route>}:bucket
-- KEYS[2]  lease hash    {rsv:<subject>:<route>}:lease:<id>
-- KEYS[3]  expiry zset   {rsv:<subject>:<route>}:expiry
-- ARGV[1]  reservation id (member of the expiry zset)
-- ARGV[2]  tenant (subject), recorded in the lease
-- ARGV[3]  units to hold (integer >= 1)
--
-- Returns one of
--   {'HELD', units, tokens_after, expires_ms}
--   {'DUPLICATE', units, state}         same id and amount seen before
--   {'CONFLICT', units_of_existing}     same id, other amount
--   {'REFUSED', retry_after_ms, tokens} not enough capacity now
--   {'TOO_LARGE', max_reservation}      refused whatever the balance
--   {'NO_POLICY'}                       no bucket published for this key
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n) return string.format('%.0f', n) end

local units = tonumber(ARGV[3])
if units == nil or units < 1 or units ~= math.floor(units) then
  return redis.error_reply('BAD_ARG reserve: units must be an integer >= 1')
end

local lease = redis.call('HMGET', KEYS[2], 'amount', 'state')
if lease[1] then
  if tonumber(lease[1]) == units then
    return {'DUPLICATE', units, lease[2]}
  end
  return {'CONFLICT', tonumber(lease[1])}
end

local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'burst', 'refill_units',
  'interval_ms', 'max_reservation', 'hold_ttl_ms', 'held')
if not b[1] then
  return {'NO_POLICY'}
end
local tokens, ts, burst = tonumber(b[1]), tonumber(b[2]), tonumber(b[3])
local refill, interval = tonumber(b[4]), tonumber(b[5])
local max_res, ttl, held = tonumber(b[6]), tonumber(b[7]), tonumber(b[8])

if units > max_res then
  return {'TOO_LARGE', max_res}
end

-- Refill. Held units count against the burst (as in the Reservoir core), so a
-- refund on settle always fits below it. Whole units only; the clock advances
-- by the time those units took (rounded up), so no fraction is credited twice.
local now = now_ms()
local room = burst - tokens - held
if room <= 0 then
  if now > ts then redis.call('HSET', KEYS[1], 'ts', int(now)) end
elseif now > ts then
  local elapsed = now - ts
  local add, new_ts
  if elapsed * refill >= room * interval then
    add, new_ts = room, now
  else
    add = math.floor(elapsed * refill / interval)
    new_ts = ts + math.ceil(add * interval / refill)
  end
  if add > 0 then
    tokens = tokens + add
    redis.call('HINCRBY', KEYS[1], 'tokens', int(add))
    redis.call('HINCRBY', KEYS[1], 'minted', int(add))
    redis.call('HSET', KEYS[1], 'ts', int(new_ts))
  end
end

if tokens < units then
  local retry = math.ceil((units - tokens) * interval / refill)
  return {'REFUSED', retry, tokens}
end

local expires = now + ttl
redis.call('HINCRBY', KEYS[1], 'tokens', -units)
redis.call('HINCRBY', KEYS[1], 'held', units)
redis.call('HSET', KEYS[2], 'tenant', ARGV[2], 'amount', int(units),
  'state', 'held', 'created_ms', int(now), 'expires_ms', int(expires))
redis.call('ZADD', KEYS[3], int(expires), ARGV[1])
return {'HELD', units, tokens - units, expires}
