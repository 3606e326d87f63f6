-- wrk script for the overhead benchmark: chat completions whose text differs per request.
--
-- BODY_KB (env, default 1) sets the body size; messages are code-like text with escapes.
-- Every request starts a new conversation (a unique id right after a shared system prompt,
-- so the router's tree inserts the whole text) except every fourth, which continues a
-- recent one (same text plus one more turn, so the tree matches almost all of it).
-- done() prints one JSON line that run.sh reads.

local kb = tonumber(os.getenv("BODY_KB") or "1")
local messages = kb >= 40 and 40 or 2
local line = 'fn step_%d(x: &str) -> String {\\n    format!(\\"{}: {}\\", x, %d)\\n}\\n'

local function text(bytes, seed)
  local parts, n, i = {}, 0, 0
  while n < bytes do
    local s = string.format(line, seed + i, i)
    parts[#parts + 1] = s
    n, i = n + #s, i + 1
  end
  return table.concat(parts)
end

local per_message = math.floor(kb * 1024 / messages)
local system = '{"model":"bench","stream":false,"max_tokens":16,"messages":[' ..
  '{"role":"system","content":"' .. text(per_message, 0) .. '"},' ..
  '{"role":"user","content":"conversation '
local rest = {}
for m = 3, messages do
  local role = (m % 2 == 1) and "assistant" or "user"
  rest[#rest + 1] = '{"role":"' .. role .. '","content":"' .. text(per_message, m * 1000) .. '"}'
end
local tail = #rest > 0 and (',' .. table.concat(rest, ',')) or ''
local follow = ',{"role":"assistant","content":"done"},{"role":"user","content":"and then?"}'
local head = "POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n" ..
  "Content-Type: application/json\r\nContent-Length: "

local counter = 0
local thread_id = 0

function setup(thread)
  thread:set("thread_id", thread_id)
  thread_id = thread_id + 1
end

function request()
  counter = counter + 1
  local id, extra = counter, ''
  if counter % 4 == 0 then
    id, extra = counter - 1 - (counter % 7), follow
  end
  local body = system .. thread_id .. "-" .. id .. '"}' .. tail .. extra .. ']}'
  return head .. #body .. "\r\n\r\n" .. body
end

function done(summary, latency, requests)
  io.write(string.format(
    '{"requests":%d,"seconds":%.3f,"errors":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration / 1e6,
    summary.errors.connect + summary.errors.read + summary.errors.write +
      summary.errors.status + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99)))
end
