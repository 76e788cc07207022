-- start.lua: mark a held lease as started (the model call is under way).
--
-- Moves no capacity; it records that the hold is now backing a real call, so a
-- later settle is expected. Idempotent on the operation id. Key layout: see
-- policy.lua.
--
-- KEYS[1]  lease hash   {rsv:<subject>:<route>}:lease:<id>
-- ARGV[1]  operation id
--
-- Returns one of
--   {'STARTED', amount}         now started (or already started by this operation)
--   {'CONFLICT', operation_id}  already started by another operation
--   {'EXPIRED'}                 the hold outlived its TTL (the sweeper refunds it)
--   {'INVALID_STATE', state}    settled or swept
--   {'UNKNOWN'}                 no such lease
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local l = redis.call('HMGET', KEYS[1], 'state', 'amount', 'expires_ms', 'operation_id')
if not l[1] then
  return {'UNKNOWN'}
end
local state, amount = l[1], tonumber(l[2])
if state == 'started' then
  if l[4] == ARGV[1] then return {'STARTED', amount} end
  return {'CONFLICT', l[4]}
end
if state ~= 'held' then
  return {'INVALID_STATE', state}
end
local now = now_ms()
if now >= tonumber(l[3]) then
  return {'EXPIRED'}
end
redis.call('HSET', KEYS[1], 'state', 'started', 'operation_id', ARGV[1],
  'started_ms', string.format('%.0f', now))
return {'STARTED', amount}
