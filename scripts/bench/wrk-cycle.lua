-- wrk-cycle.lua: wrk drives `reservoir serve` with the benchmark's cycle,
-- reserve 600 → start → settle 180, each with a fresh reservation id.
--
-- wrk keeps one Lua state per thread, shared by that thread's connections, and
-- does not say which connection a response came back on. The script therefore
-- reads the id and state from each answer and queues that reservation's next
-- step; a connection that finds the queue empty opens a new cycle. A
-- connection sends only after its previous answer arrived (no pipelining), so
-- the queue never holds more than the thread's connections.
--
-- Arguments (after `--`): subjects (8), route ("chat"), subject prefix
-- ("tenant-"): the subjects are <prefix>1 .. <prefix>N, the names
-- `reservoir-loadgen` uses. Their policies for that route must exist
-- (scripts/bench-http publishes them with `reservoir-loadgen publish`).
--
-- At the end it prints one line, summed over the threads:
--   wrk-cycle: reserved=N started=N settled=N unexpected=N
-- settled counts completed cycles; unexpected counts answers that were not 2xx
-- or named no known state (their reservation is abandoned).
local threads = {}
function setup(thread)
  threads[#threads + 1] = thread
  thread:set("tid", #threads)
end

local subjects, route, subject_prefix, prefix
local counter = 0
local queue = {}
local headers = { ["Content-Type"] = "application/json" }
-- globals, so that done() can read them from each thread
reserved, started, settled, unexpected = 0, 0, 0, 0

function init(args)
  subjects = tonumber(args[1] or "8")
  route = args[2] or "chat"
  subject_prefix = args[3] or "tenant-"
  -- ids unique across threads and across runs against the same server
  prefix = string.format("w%x-%d", os.time(), tid)
end

function request()
  local n = #queue
  if n > 0 then
    local r = queue[n]
    queue[n] = nil
    return r
  end
  counter = counter + 1
  local id = prefix .. "-" .. counter
  local subject = subject_prefix .. (counter % subjects + 1)
  return wrk.format("POST", "/v1/reservations", headers,
    '{"id":"' .. id .. '","subject":"' .. subject .. '","route":"' .. route .. '","units":600}')
end

function response(status, _, body)
  -- a reservation answers 201 Created, start and settle 200 OK
  if status < 200 or status > 299 then
    unexpected = unexpected + 1
    return
  end
  local id = body:match('"id":"([^"]+)"')
  local state = body:match('"state":"(%u+)"')
  if state == "RESERVED" then
    reserved = reserved + 1
    queue[#queue + 1] = wrk.format("POST", "/v1/reservations/" .. id .. "/start", headers,
      '{"operation_id":"op-' .. id .. '"}')
  elseif state == "STARTED" then
    started = started + 1
    queue[#queue + 1] = wrk.format("POST", "/v1/reservations/" .. id .. "/settle", headers,
      '{"actual_units":180}')
  elseif state == "SETTLED" then
    settled = settled + 1
  else
    unexpected = unexpected + 1
  end
end

function done()
  local t = { reserved = 0, started = 0, settled = 0, unexpected = 0 }
  for _, thread in ipairs(threads) do
    for k in pairs(t) do
      t[k] = t[k] + (tonumber(thread:get(k)) or 0)
    end
  end
  io.write(string.format("wrk-cycle: reserved=%d started=%d settled=%d unexpected=%d\n",
    t.reserved, t.started, t.settled, t.unexpected))
end
