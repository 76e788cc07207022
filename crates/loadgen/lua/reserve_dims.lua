-- reserve_dims.lua: admit a request in several dimensions (e.g. requests,
-- input tokens, output tokens) and hold its capacity in every one, in one
-- atomic step: the Redis + Lua baseline of a multi-dimension policy.
--
-- One bucket hash per dimension (each published with policy.lua, so each has
-- its own refill, burst, opening and largest reservation, and its own books:
-- opening + minted = tokens + held + spent). Every bucket is refilled from the
-- time elapsed (as reserve.lua does for one); the reserve is refused if any
-- dimension refuses, and only then is nothing debited; else every dimension is
-- debited and ONE lease records the amounts of all of them. As in the
-- Reservoir core: a request too large for any dimension is refused first,
-- then a dimension in debt (tokens < 0) refuses whatever is asked of it, then
-- a dimension short of capacity; the answer names the refusing dimension whose
-- refill takes longest and that wait. Idempotent on the reservation id: the
-- same amounts again answer DUPLICATE, other amounts CONFLICT.
--
-- Lease fields: the first dimension's amount is `amount` (the layout of
-- reserve.lua, so start.lua works unchanged), dimension i > 1 is `amount_<i>`,
-- and `dims` is how many there are.
--
-- KEYS[1..n]  bucket hash of each dimension, e.g. {rsv:S:R}:bucket,
--             {rsv:S:R}:bucket:input_tokens, {rsv:S:R}:bucket:output_tokens
-- KEYS[n+1]   lease hash    {rsv:S:R}:lease:<id>
-- KEYS[n+2]   expiry zset   {rsv:S:R}:expiry
-- ARGV[1]     reservation id
-- ARGV[2]     tenant (subject), recorded in the lease
-- ARGV[3..]   units to hold in dimension 1..n (integers; >= 1 in dimension 1)
--
-- Returns one of
--   {'HELD', expires_ms, tokens_after_1, ..., tokens_after_n}
--   {'DUPLICATE', state}
--   {'CONFLICT', i, units_of_existing_i}      first dimension that differs
--   {'REFUSED', i, retry_after_ms, tokens_i}  i = the limiting dimension
--   {'TOO_LARGE', i, max_reservation_i}
--   {'NO_POLICY', i}
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(n) return string.format('%.0f', n) end
local function field(i) if i == 1 then return 'amount' end return 'amount_' .. i end

local n = #KEYS - 2
if n < 1 or #ARGV ~= n + 2 then
  return redis.error_reply('BAD_ARG reserve_dims: n buckets + lease + expiry keys, id + tenant + n units')
end
local lease_key, expiry_key = KEYS[n + 1], KEYS[n + 2]
local units = {}
for i = 1, n do
  local u = tonumber(ARGV[i + 2])
  if u == nil or u < 0 or u ~= math.floor(u) or (i == 1 and u < 1) then
    return redis.error_reply('BAD_ARG reserve_dims: units of dimension ' .. i)
  end
  units[i] = u
end

if redis.call('EXISTS', lease_key) == 1 then
  for i = 1, n do
    local have = tonumber(redis.call('HGET', lease_key, field(i)) or '-1')
    if have ~= units[i] then return {'CONFLICT', i, have} end
  end
  return {'DUPLICATE', redis.call('HGET', lease_key, 'state')}
end

local b = {}
for i = 1, n do
  local f = redis.call('HMGET', KEYS[i], 'tokens', 'ts', 'burst', 'refill_units',
    'interval_ms', 'max_reservation', 'held')
  if not f[1] then return {'NO_POLICY', i} end
  b[i] = {tokens = tonumber(f[1]), ts = tonumber(f[2]), burst = tonumber(f[3]),
    refill = tonumber(f[4]), interval = tonumber(f[5]), max_res = tonumber(f[6]),
    held = tonumber(f[7])}
  if units[i] > b[i].max_res then return {'TOO_LARGE', i, b[i].max_res} end
end
local ttl = tonumber(redis.call('HGET', KEYS[1], 'hold_ttl_ms'))

-- Refill every dimension, exactly as reserve.lua refills its one bucket: held
-- units count against the burst, debt (tokens < 0) is repaid first.
local now = now_ms()
for i = 1, n do
  local d = b[i]
  local room = d.burst - d.tokens - d.held
  if room <= 0 then
    if now > d.ts then redis.call('HSET', KEYS[i], 'ts', int(now)) end
  elseif now > d.ts then
    local elapsed, add, new_ts = now - d.ts
    if elapsed * d.refill >= room * d.interval then
      add, new_ts = room, now
    else
      add = math.floor(elapsed * d.refill / d.interval)
      new_ts = d.ts + math.ceil(add * d.interval / d.refill)
    end
    if add > 0 then
      d.tokens = d.tokens + add
      redis.call('HINCRBY', KEYS[i], 'tokens', int(add))
      redis.call('HINCRBY', KEYS[i], 'minted', int(add))
      redis.call('HSET', KEYS[i], 'ts', int(new_ts))
    end
  end
end

-- Admission: debt anywhere refuses; the answer names the dimension that frees last.
local worst, worst_wait
for i = 1, n do
  local d = b[i]
  if d.tokens < 0 or d.tokens < units[i] then
    local wait = math.ceil((units[i] - d.tokens) * d.interval / d.refill)
    if worst == nil or wait > worst_wait then worst, worst_wait = i, wait end
  end
end
if worst then return {'REFUSED', worst, worst_wait, b[worst].tokens} end

local expires = now + ttl
local lease = {'tenant', ARGV[2], 'state', 'held', 'dims', n,
  'created_ms', int(now), 'expires_ms', int(expires)}
local reply = {'HELD', expires}
for i = 1, n do
  redis.call('HINCRBY', KEYS[i], 'tokens', int(-units[i]))
  redis.call('HINCRBY', KEYS[i], 'held', int(units[i]))
  lease[#lease + 1] = field(i)
  lease[#lease + 1] = int(units[i])
  reply[#reply + 1] = b[i].tokens - units[i]
end
redis.call('HSET', lease_key, unpack(lease))
redis.call('ZADD', expiry_key, int(expires), ARGV[1])
return reply
