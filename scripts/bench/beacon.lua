-- scripts/bench/beacon.lua - wrk script of scripts/bench.sh: POSTs realistic beacons.
--
--   wrk ... -s beacon.lua URL -- NONCE BATCH SITES
--
-- NONCE  8 hex digits, different for every wrk run of a benchmark (bench.sh counts them up)
-- BATCH  measurements per request: 1 sends one JSON object, N > 1 a JSON array of N
-- SITES  number of registered sites named bench-01 .. bench-NN (one is picked per request)
--
-- Every measurement gets an id that never repeats within a benchmark run: the first group is
-- the run's NONCE, the second the wrk thread, the last a per-thread counter (the rest is
-- random, with the version-4 and variant bits set, so the ids look like crypto.randomUUID()).
-- Sites, page URLs, referrers, user agents and metric values vary per request, like a fleet
-- of shops would send them; the body is sent as text/plain like navigator.sendBeacon does.
--
-- done() prints one machine-readable line: BENCH_WRK requests=.. duration_us=.. errors=...

-- `tid` is a global on purpose: setup() sets it in each thread's Lua state.
local nonce, batch, nsites = "00000000", 1, 20
local counter = 0
local threads = 0

function setup(thread)
   threads = threads + 1
   thread:set("tid", threads)
end

function init(args)
   nonce = args[1] or nonce
   batch = tonumber(args[2] or "1")
   nsites = tonumber(args[3] or "20")
   math.randomseed(tonumber(nonce, 16) * 131 + (tid or 0) * 7919)
end

local random, format, concat = math.random, string.format, table.concat
local paths = {
   "/", "/products/%d", "/products/%d?variant=%d", "/category/%d", "/category/%d?page=%d",
   "/search?q=item+%d", "/cart", "/checkout/shipping", "/account/orders/%d",
   "/blog/%d-summer-sale?utm_source=newsletter&utm_medium=email&utm_campaign=c%d",
}
local referrers = {
   "https://www.google.com/", "https://www.bing.com/", "https://duckduckgo.com/",
   "https://www.facebook.com/", "https://shop%02d.example/", "https://shop%02d.example/cart",
}
local navigation = { "navigate", "navigate", "navigate", "navigate", "reload", "back_forward",
   "prerender", "restore" }
local connection = { "4g", "4g", "4g", "4g", "3g", "2g", "slow-2g" }
local widths = { 360, 375, 390, 412, 414, 768, 1024, 1280, 1366, 1440, 1536, 1920 }
local agents = {
   "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
   "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
   "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Mobile Safari/537.36",
   "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4 Safari/605.1.15",
   "Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0",
}

-- Built once per thread: the per-request work is a handful of random() calls and one
-- string.format per measurement, so that wrk on one core can keep up with nginx.
local path_pool, header_pool, referrer_pool = {}, {}, {}
local function pools()
   if #path_pool > 0 then return end
   for i = 1, 4096 do
      path_pool[i] = format(paths[random(#paths)], random(1, 99999), random(1, 50))
   end
   for site = 1, nsites do
      header_pool[site], referrer_pool[site] = {}, {}
      for a = 1, #agents do
         header_pool[site][a] = {
            ["Content-Type"] = "text/plain;charset=UTF-8",
            ["Origin"] = format("https://shop%02d.example", site),
            ["User-Agent"] = agents[a],
            ["Accept"] = "*/*",
         }
      end
      for r = 1, #referrers do referrer_pool[site][r] = format(referrers[r], site) end
   end
end

local TEMPLATE = '{"id":"%s-%04x-4%03x-%x%03x-%012x","site":"bench-%02d","url":"https://shop%02d.example%s",'
   .. '"ts":%d,"referrer":"%s","navigation_type":"%s","ttfb_ms":%.1f,"fcp_ms":%.1f,"lcp_ms":%.1f,'
   .. '"inp_ms":%.1f,"dom_content_loaded_ms":%.1f,"load_ms":%.1f,"cls":%.3f,"viewport_width":%d,'
   .. '"effective_connection_type":"%s"}'

local function measurement(site, now_ms)
   counter = counter + 1
   local ttfb = 40 + random() * 900
   local fcp = ttfb + random() * 1500
   local lcp = fcp + random() * 2500
   return format(TEMPLATE, nonce, tid or 0, random(0, 4095), random(8, 11), random(0, 4095),
      counter, site, site, path_pool[random(#path_pool)], now_ms - random(0, 3000),
      referrer_pool[site][random(#referrers)], navigation[random(#navigation)],
      ttfb, fcp, lcp, 8 + random() * 592, fcp + random() * 800, lcp + random() * 3000,
      random() * random() * 0.6, widths[random(#widths)], connection[random(#connection)])
end

function request()
   pools()
   local site = random(1, nsites)
   local now_ms = os.time() * 1000 + random(0, 999)
   local body
   if batch == 1 then
      body = measurement(site, now_ms)
   else
      local items = {}
      for i = 1, batch do items[i] = measurement(site, now_ms) end
      body = "[" .. concat(items, ",") .. "]"
   end
   return wrk.format("POST", nil, header_pool[site][random(#agents)], body)
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(format("BENCH_WRK requests=%d duration_us=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p99_us=%d max_us=%d\n",
      summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
      latency:percentile(50), latency:percentile(99), latency.max))
end
