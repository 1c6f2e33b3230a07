-- wrk's script for bench/cluster.py: every request posts one /cache turn for a character
-- picked at random out of the file given as the first argument (one name a line), with a
-- body unique to its thread and count. No response() hook: wrk then counts answers in C
-- (a status >= 400 shows as errors.status), without a Lua call per answer.
local names = {}
local counter = 0
id = 0  -- set per thread by setup() (thread:set), read by init() and request()
local threads = {}

function setup(thread)
  table.insert(threads, thread)
  thread:set("id", #threads)
end

function init(args)
  for line in io.lines(args[1]) do
    if #line > 0 then
      table.insert(names, line)
    end
  end
  math.randomseed(tonumber(args[2] or "7") + id)
end

function request()
  counter = counter + 1
  local name = names[math.random(#names)]
  local body = string.format('{"input_history": [{"role": "user", "content": "w%d-%d"}]}', id, counter)
  return wrk.format("POST", "/cache/" .. name, {["Content-Type"] = "application/json"}, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("NEKOMEM %d %d %d %d %d %d %.1f %.1f %d\n", summary.requests, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(99), summary.duration))
end
