# test_http.py — kvhttp driven by the official openai client and by raw sockets; run by tests/test_http.sh.
# argv: BASE_URL (http://127.0.0.1:PORT). Prints cmocka-like lines; exit status 1 on any failure.
import json
import socket
import sys
import threading
import time
import urllib.parse

base = sys.argv[1]
host, port = urllib.parse.urlparse(base).hostname, urllib.parse.urlparse(base).port
fails = 0
passes = 0


def ok(name):
    global passes
    passes += 1
    print("[       OK ] " + name, flush=True)


def bad(name, why=""):
    global fails
    fails += 1
    print("[  FAILED  ] %s %s" % (name, why), flush=True)


def check(name, cond, why=""):
    (ok if cond else (lambda n: bad(n, why)))(name)


def raw(data, read=True, timeout=600):
    """Send bytes on a fresh connection, return everything read until the server closes."""
    s = socket.create_connection((host, port), timeout=timeout)
    s.sendall(data)
    out = b""
    if read:
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
        except socket.timeout:
            pass
    s.close()
    return out


def post_raw(path, body, extra=b""):
    req = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Connection: close\r\n" + extra + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return raw(req)


def status_of(resp):
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def body_json(resp):
    try:
        return json.loads(resp.split(b"\r\n\r\n", 1)[1])
    except (IndexError, ValueError):
        return None


def openai_part():
    try:
        import openai
    except ImportError:
        print("[  SKIPPED ] openai client: the package is not installed", flush=True)
        return
    c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=600)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}]

    models = c.models.list()
    check("models.list names the loaded model", len(models.data) == 1 and models.data[0].id)

    r = c.chat.completions.create(model="x", messages=msgs, max_tokens=12, temperature=0)
    ch = r.choices[0]
    check("chat: text, finish_reason and usage", ch.message.content and ch.finish_reason in ("stop", "length")
          and r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
          and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, repr(r))
    greedy = ch.message.content

    r = c.completions.create(model="x", prompt="The capital of France is", max_tokens=8, temperature=0)
    check("completions: text and length finish", r.choices[0].text and r.choices[0].finish_reason == "length"
          and r.usage.completion_tokens == 8, repr(r))
    text0 = r.choices[0].text

    parts, usage, finish = [], None, None
    for chunk in c.chat.completions.create(model="x", messages=msgs, max_tokens=12, temperature=0, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for d in chunk.choices:
            if d.delta.content:
                parts.append(d.delta.content)
            if d.finish_reason:
                finish = d.finish_reason
    check("chat stream equals the non-streamed text at temperature 0", "".join(parts) == greedy,
          repr(("".join(parts), greedy)))
    check("chat stream ends with usage (include_usage)", usage is not None and usage.completion_tokens > 0
          and finish in ("stop", "length"))

    parts = [ch.text for ch in c.completions.create(model="x", prompt="The capital of France is", max_tokens=8,
                                                    temperature=0, stream=True) for ch in ch.choices]
    check("completions stream equals the non-streamed text", "".join(parts) == text0, repr(parts))

    # A stop string made of the end of one token and the start of the next.
    full = text0
    cut = None
    for i in range(1, len(full) - 2):
        if full[i] != " " and full[i + 1] != " ":
            cut = (i, full[i:i + 3])
            break
    if cut:
        r = c.completions.create(model="x", prompt="The capital of France is", max_tokens=8, temperature=0,
                                 stop=[cut[1]])
        check("stop string: cut before it, never emitted, finish stop",
              r.choices[0].text == full[:cut[0]] and r.choices[0].finish_reason == "stop", repr((r, cut)))
        parts = [x.text for ch in c.completions.create(model="x", prompt="The capital of France is", max_tokens=8,
                                                       temperature=0, stop=[cut[1]], stream=True)
                 for x in ch.choices]
        check("stop string in a stream", "".join(parts) == full[:cut[0]], repr(parts))

    # usage.prompt_tokens_details.cached_tokens: what kvd's prefix cache supplied (whole blocks).
    story = ("Zebras quietly measured seventeen purple lighthouses along the frozen canal before "
             "breakfast, then argued politely about the colour of the moon over tea.")
    kw = dict(model="x", prompt=story, max_tokens=2, temperature=0)
    a = c.completions.create(**kw).usage
    b = c.completions.create(**kw).usage
    check("completions cached_tokens: 0 for a fresh prompt, > 0 for the same one again",
          a.prompt_tokens_details.cached_tokens == 0 and 0 < b.prompt_tokens_details.cached_tokens < b.prompt_tokens,
          repr((a, b)))
    cm = [{"role": "user", "content": story}]
    c.chat.completions.create(model="x", messages=cm, max_tokens=2, temperature=0)
    b = c.chat.completions.create(model="x", messages=cm, max_tokens=2, temperature=0).usage
    check("chat cached_tokens: > 0 for a repeated conversation",
          0 < b.prompt_tokens_details.cached_tokens < b.prompt_tokens, repr(b))
    su = [ch.usage for ch in c.chat.completions.create(model="x", messages=cm, max_tokens=2, temperature=0,
                                                       stream=True, stream_options={"include_usage": True})
          if ch.usage]
    check("streamed usage carries cached_tokens", len(su) == 1 and
          su[0].prompt_tokens_details.cached_tokens == b.prompt_tokens_details.cached_tokens, repr(su))

    r = c.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0, n=2)
    check("n=2: two choices, both greedy text", len(r.choices) == 2 and
          sorted(x.index for x in r.choices) == [0, 1] and r.choices[0].message.content == r.choices[1].message.content)

    a = c.completions.create(model="x", prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=1234)
    b = c.completions.create(model="x", prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=1234)
    check("seed: temperature 1 twice with the same seed gives the same text", a.choices[0].text == b.choices[0].text)

    conv = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one?"}]
    r = c.chat.completions.create(model="x", messages=conv, max_tokens=8, temperature=0)
    check("a whole conversation (system, user, assistant, user)", r.choices[0].message.content and
          r.usage.prompt_tokens > 0, repr(r))
    # A prompt greedy decoding repeats; a penalty on what the request generated breaks the repeats.
    kw = dict(model="x", prompt="A A A A A A A A A A A A", max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    a = c.completions.create(frequency_penalty=2.0, **kw).choices[0].text
    b = c.completions.create(**kw).choices[0].text
    check("frequency_penalty is applied (2.0 changes the greedy text)", a != b, repr((a, b)))

    r = c.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                  top_logprobs=2)
    lp = r.choices[0].logprobs.content
    check("chat logprobs: one per token, greedy picks the most likely, 2 alternatives",
          len(lp) == r.usage.completion_tokens and all(x.logprob <= 0 and len(x.top_logprobs) == 2 and
                                                       abs(x.logprob - x.top_logprobs[0].logprob) < 1e-6 for x in lp),
          repr(lp[:2]))
    n = 0
    for chunk in c.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                           stream=True):
        for d in chunk.choices:
            n += len(d.logprobs.content) if d.logprobs and d.logprobs.content else 0
    check("streamed chat logprobs: as many entries as tokens", n == len(lp), "%d vs %d" % (n, len(lp)))
    r = c.completions.create(model="x", prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=1)
    l = r.choices[0].logprobs
    check("completions logprobs: tokens spell the text", "".join(l.tokens) == r.choices[0].text and
          len(l.token_logprobs) == 8 and len(l.top_logprobs) == 8, repr(l))

    for name, kw, param in [("top_logprobs over 20", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                            ("presence_penalty out of range", {"presence_penalty": 3}, "presence_penalty"),
                            ("response_format json", {"response_format": {"type": "json_object"}}, "response_format")]:
        try:
            c.chat.completions.create(model="x", messages=msgs, max_tokens=4, **kw)
            bad("%s: refused with 400" % name, "accepted")
        except openai.BadRequestError as e:
            check("%s: refused with 400 naming the field" % name, param in str(e), str(e))

    try:
        c.completions.create(model="x", prompt="hi " * 10, max_tokens=1 << 20)
        bad("max_tokens over the context: 400", "accepted")
    except openai.BadRequestError as e:
        check("max_tokens over the context: 400 context_length_exceeded", "context_length_exceeded" in str(e), str(e))


def metrics():
    """GET /metrics as {series with labels: value}."""
    out = {}
    r = raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    for line in r.split(b"\r\n\r\n", 1)[-1].decode(errors="replace").splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                out[k] = float(v)
            except ValueError:
                pass
    return out


def metrics_part():
    m0 = metrics()
    names = ["kvd:time_to_first_token_seconds_count", "kvd:inter_token_latency_seconds_count",
             "kvd:prompt_tokens_total", "kvd:generation_tokens_total",
             'kvd:request_success_total{finished_reason="length"}', "kvd:kv_cache_usage_perc",
             'kvd:time_to_first_token_seconds_bucket{le="0.001"}', 'kvd:time_to_first_token_seconds_bucket{le="2560"}',
             'kvd:inter_token_latency_seconds_bucket{le="0.01"}', 'kvd:inter_token_latency_seconds_bucket{le="80"}',
             'kvd:time_to_first_token_seconds_bucket{le="+Inf"}']
    missing = [n for n in names if n not in m0]
    check("/metrics has the kvd: series with vLLM's bucket bounds", not missing, repr(missing))
    if missing:
        return
    r = post_raw("/v1/completions", json.dumps({"prompt": "Metrics, please:", "max_tokens": 4, "temperature": 0,
                                                "ignore_eos": True}).encode())
    u = (body_json(r) or {}).get("usage", {})
    m1 = metrics()
    d = {n: m1[n] - m0[n] for n in names}
    check("/metrics counts grow after a request: TTFT 1, ITL 3, tokens, finished length",
          status_of(r) == 200 and u.get("completion_tokens") == 4 and
          d["kvd:time_to_first_token_seconds_count"] >= 1 and d["kvd:inter_token_latency_seconds_count"] >= 3 and
          d["kvd:prompt_tokens_total"] >= u.get("prompt_tokens", 1) and d["kvd:generation_tokens_total"] >= 4 and
          d['kvd:request_success_total{finished_reason="length"}'] >= 1 and
          m1["kvd:time_to_first_token_seconds_sum"] > m0["kvd:time_to_first_token_seconds_sum"] and
          0 <= m1["kvd:kv_cache_usage_perc"] <= 1, repr((d, u)))


def raw_part():
    r = post_raw("/v1/chat/completions", b"{not json")
    j = body_json(r)
    check("malformed JSON: 400 with an error object", status_of(r) == 400 and j and "message" in j["error"]
          and "type" in j["error"] and "param" in j["error"] and "code" in j["error"], repr(r[:300]))
    r = post_raw("/v1/completions", b'{"prompt": "hi", "max_tokens": "ten"}')
    j = body_json(r)
    check("wrong type: 400 naming the param", status_of(r) == 400 and j and j["error"]["param"] == "max_tokens",
          repr(r[:300]))
    r = post_raw("/v1/chat/completions", b'{"messages": [{"role":"user","content":"a"},{"role":"tool",'
                 b'"content":"b"}]}')
    check("a tool message: 400 not supported", status_of(r) == 400 and b"not supported" in r, repr(r[:300]))
    r = raw(b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    check("unknown path: 404", status_of(r) == 404, repr(r[:200]))
    # Refused from its Content-Length alone, before the body is read.
    r = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (8 << 20) + b'{"prompt": "' + b"a" * 65536)
    j = body_json(r)
    check("a body over the limit: 413 with an error object", status_of(r) == 413 and j and "error" in j,
          repr(r[:200]))
    # Chunked, with no length to judge it by: refused once the limit is passed.
    s = socket.create_connection((host, port), timeout=600)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    r = b""
    try:
        for _ in range(17):  # just past the 1 MiB the test gives --max-body
            s.sendall(b"10000\r\n" + b"a" * 65536 + b"\r\n")
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            r += b
    except OSError:
        pass
    s.close()
    check("a chunked body over the limit: 413", status_of(r) == 413, repr(r[:200]))
    r = raw(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    check("pipelined requests: two answers in order", r.count(b"HTTP/1.1 200") == 2 and
          r.index(b'"status"') < r.index(b'"list"'), repr(r[:400]))

    # Slow loris: half a request line, then nothing; the server closes it after its timeout.
    s = socket.create_connection((host, port), timeout=600)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    t0 = time.time()
    try:
        closed = s.recv(100) == b""
    except (socket.timeout, ConnectionResetError):
        closed = True
    s.close()
    check("slow-loris headers: the connection is closed by the server (%.1f s)" % (time.time() - t0), closed)

    # Hang up mid-stream. ignore_eos: a sampled end-of-text as the first token would end the stream
    # before there is anything to hang up on.
    body = json.dumps({"prompt": "Write a long story.", "max_tokens": 2000, "stream": True,
                       "temperature": 0.8, "ignore_eos": True}).encode()
    s = socket.create_connection((host, port), timeout=600)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: ") < 3:
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    check("a stream starts with SSE chunks", got.count(b"data: ") >= 3 and b"text/event-stream" in got, repr(got[:600]))

    # 100 concurrent streams, each to its end.
    results = [None] * 100

    def one(i):
        b = json.dumps({"prompt": "Count: %d," % i, "max_tokens": 8, "stream": True, "temperature": 0}).encode()
        try:
            r = post_raw("/v1/completions", b)
            results[i] = r.endswith(b"data: [DONE]\n\n") or b"data: [DONE]" in r
        except OSError:
            results[i] = False
    th = [threading.Thread(target=one, args=(i,)) for i in range(100)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    check("100 concurrent streams all end with [DONE]", all(results), "%d of 100" % sum(bool(x) for x in results))


if __name__ == "__main__":
    part = sys.argv[2] if len(sys.argv) > 2 else "all"
    if part in ("all", "openai"):
        openai_part()
    if part in ("all", "raw"):
        metrics_part()
        raw_part()
    sys.exit(1 if fails else 0)
