#!/usr/bin/env python3
"""loadgen.py — closed-loop load on llama-server's /completion, as kvbench puts on kvd.

Each of N clients is one thread with one HTTP connection sending its
requests one after another: a prompt of exactly P tokens (distinct per
request, cut from a text and sent as token ids, their count checked with
/tokenize and again in the server's reply), O output tokens (ignore_eos,
greedy, cache_prompt false, so every prompt is computed). Output tok/s is
kvbench's: all output tokens over the time from the start to the end of the
last request. Prints one JSON object.

    loadgen.py --port PORT [--clients 16] [--requests 2] [--prompt-len 128]
               [--output-len 128] [--text FILE]
    loadgen.py --port PORT --wait SECONDS     (status 0 once the server is ready)
"""
import argparse
import http.client
import json
import sys
import threading
import time

TIMEOUT_S = 600  # one request; the caller bounds the whole run with timeout(1)


def post(conn, path, body):
    """The JSON reply of POST path; raises on a non-200 status."""
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    if resp.status != 200:
        raise RuntimeError(f"{path}: HTTP {resp.status}: {data[:200]!r}")
    return json.loads(data)


def wait_ready(port, seconds):
    """True once /health answers 200 (the model loaded), False after seconds."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def make_prompts(port, text, n, length):
    """n distinct prompts of exactly length token ids, from successive stretches of text."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    # Whole text once: the prompts are consecutive windows of its tokens.
    toks = post(conn, "/tokenize", {"content": text, "add_special": False})["tokens"]
    toks = [t["id"] if isinstance(t, dict) else t for t in toks]
    prompts, step = [], length
    # Windows overlap only when the text is short; each still starts elsewhere.
    if len(toks) < n * length + length:
        step = max(1, (len(toks) - length) // max(1, n))
    for i in range(n):
        lo = (i * step) % max(1, len(toks) - length)
        p = toks[lo:lo + length]
        if len(p) != length:
            raise RuntimeError(f"the text has {len(toks)} tokens, too few for {length}-token prompts")
        prompts.append(p)
    if len({tuple(p) for p in prompts}) != n:
        raise RuntimeError("the prompts are not distinct")
    # As text, a window re-tokenizes to about its length (its cut ends may merge differently);
    # the count that matters, the server's tokens_evaluated, is checked for every request.
    for p in prompts[:2]:
        s = post(conn, "/detokenize", {"tokens": p})["content"]
        m = len(post(conn, "/tokenize", {"content": s, "add_special": False})["tokens"])
        if abs(m - length) > 4:
            print(f"loadgen: note: a {length}-token prompt re-tokenizes to {m} tokens", file=sys.stderr)
    conn.close()
    return prompts


def request(conn, prompt, out):
    """One completion; (prompt tokens evaluated, tokens predicted)."""
    r = post(conn, "/completion", {"prompt": prompt, "n_predict": out, "cache_prompt": False,
                                   "ignore_eos": True, "temperature": 0, "stream": False})
    return r.get("tokens_evaluated", r.get("timings", {}).get("prompt_n", -1)), r["tokens_predicted"]


def client(port, prompts, out, start, res):
    """One client's requests, after start is set; its results appended to res."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    start.wait()
    for p in prompts:
        try:
            n_in, n_out = request(conn, p, out)
            res.append((n_in, n_out, time.monotonic(), None))
        except Exception as e:  # reported, counted as an error
            res.append((0, 0, time.monotonic(), str(e)))
    conn.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=2, help="requests per client")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--wait", type=float, default=0,
                    help="only wait up to WAIT seconds for the server to be ready; status 0 if it is")
    a = ap.parse_args()
    if a.wait:
        return 0 if wait_ready(a.port, a.wait) else 1
    with open(a.text, encoding="utf-8", errors="replace") as f:
        text = f.read()
    n = a.clients * a.requests
    prompts = make_prompts(a.port, text, n + 1, a.prompt_len)
    # A short warm-up request first, as kvbench's run is preceded by one.
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=TIMEOUT_S)
    request(conn, prompts[n], 8)
    conn.close()

    start, res, threads = threading.Event(), [], []
    for c in range(a.clients):
        mine = prompts[c * a.requests:(c + 1) * a.requests]
        threads.append(threading.Thread(target=client, args=(a.port, mine, a.output_len, start, res)))
        threads[-1].start()
    t0 = time.monotonic()
    start.set()
    for t in threads:
        t.join()
    errors = [e for *_, e in res if e]
    ok = [r for r in res if not r[3]]
    tokens = sum(r[1] for r in ok)
    dur = max((r[2] for r in ok), default=t0) - t0
    bad_in = sum(1 for r in ok if r[0] != a.prompt_len)
    bad_out = sum(1 for r in ok if r[1] != a.output_len)
    print(json.dumps({"clients": a.clients, "requests": len(ok), "errors": len(errors),
                      "output_tokens": tokens, "duration_s": round(dur, 3),
                      "output_tok_s": round(tokens / dur, 2) if dur > 0 else None,
                      "prompt_len_mismatch": bad_in, "output_len_mismatch": bad_out}))
    for e in errors[:3]:
        print(f"loadgen: {e}", file=sys.stderr)
    if errors or bad_in or bad_out or not ok:
        print(f"loadgen: {len(errors)} errors, {bad_in} prompts not of {a.prompt_len} tokens, "
              f"{bad_out} outputs not of {a.output_len} tokens", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
