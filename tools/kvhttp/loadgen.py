# loadgen.py — N streaming clients through kvhttp, closed loop, Python's standard library only: tokens/s, TTFT, ITL.
# usage: python3 loadgen.py URL CLIENTS REQUESTS_PER_CLIENT OUTPUT_TOKENS [PROMPT_WORDS]
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

url, clients, per, out_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
words = int(sys.argv[5]) if len(sys.argv) > 5 else 100
u = urllib.parse.urlparse(url)
ttft, itl, tokens = [], [], [0]
lock = threading.Lock()


def client(k):
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=3600)
    for j in range(per):
        # Distinct prompts: no prefix-cache hit makes one client cheaper than another.
        prompt = " ".join("w%d_%d_%d" % (k, j, i) for i in range(words))
        body = json.dumps({"prompt": prompt, "max_tokens": out_len, "stream": True, "temperature": 0,
                           "ignore_eos": True})
        t0 = time.monotonic()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        last, first, n, gaps = None, None, 0, []
        buf = b""
        while True:
            chunk = r.read1(65536)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev == b"data: [DONE]" or not ev.startswith(b"data: "):
                    continue
                now = time.monotonic()
                if first is None:
                    first = now - t0
                elif last is not None:
                    gaps.append(now - last)
                last = now
                n += 1
        with lock:
            if first is not None:
                ttft.append(first)
            itl.extend(gaps)
            tokens[0] += n


t0 = time.monotonic()
th = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
for t in th:
    t.start()
for t in th:
    t.join()
wall = time.monotonic() - t0


def pct(v, q):
    return sorted(v)[min(len(v) - 1, int(q * len(v)))] if v else 0


print(json.dumps({"clients": clients, "requests": clients * per, "chunks": tokens[0], "wall_s": round(wall, 2),
                  "tok_per_s": round(tokens[0] / wall, 1), "ttft_p50_ms": round(1e3 * pct(ttft, .5), 1),
                  "ttft_p99_ms": round(1e3 * pct(ttft, .99), 1), "itl_p50_ms": round(1e3 * pct(itl, .5), 2),
                  "itl_p99_ms": round(1e3 * pct(itl, .99), 2)}))
