#!/bin/sh
# test_http.sh — kvhttp against a real kvd: the openai Python client (pinned, in a venv made here), raw HTTP edge cases, curl.
# KVD_BIN / KVHTTP_BIN / KVCTL_BIN pick the programs (the ASan pass sets KVD_BIN); no step has a deadline a slow
# machine could miss: waits are bounded only to end a hang.
. tests/lib/harness.sh
B=${B:-build}
KVD=${KVD_BIN:-$B/kvd}
KVHTTP=${KVHTTP_BIN:-$(dirname "$KVD")/kvhttp}
KVCTL=${KVCTL_BIN:-$(dirname "$KVD")/kvctl}
model=${KVD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
OPENAI_VERSION=1.59.9
venv=${KVHTTP_VENV:-$B/http-venv}
tmp=$(mktemp -d /tmp/kvd-http.XXXXXX)
kvd_pid=
http_pid=
cleanup() {
	[ -n "$http_pid" ] && kill "$http_pid" 2>/dev/null && wait "$http_pid" 2>/dev/null
	[ -n "$kvd_pid" ] && kill "$kvd_pid" 2>/dev/null && wait "$kvd_pid" 2>/dev/null
	rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

if [ ! -x "$KVHTTP" ] || [ ! -x "$KVD" ] || [ ! -r "$model" ] || ! have curl || ! have python3; then
	skipped "kvhttp: needs $KVHTTP, $KVD, $model, curl and python3"
	summary test_http
	exit $?
fi

# Until file $1 holds pattern $2 or process $3 dies; 10 min only bounds a hang.
wait_for() {
	i=0
	while ! grep -q "$2" "$1" 2>/dev/null && [ $i -lt 6000 ] && kill -0 "$3" 2>/dev/null; do
		sleep 0.1
		i=$((i + 1))
	done
	grep -q "$2" "$1" 2>/dev/null
}

start_kvd() {
	"$KVD" --config /dev/null --model "$model" --socket "$tmp/kvd.sock" --kv-blocks 1024 >"$tmp/kvd.log" 2>&1 &
	kvd_pid=$!
	i=0
	while [ ! -S "$tmp/kvd.sock" ] && [ $i -lt 6000 ] && kill -0 "$kvd_pid" 2>/dev/null; do
		sleep 0.1
		i=$((i + 1))
	done
	[ -S "$tmp/kvd.sock" ]
}

if ! start_kvd; then
	if grep -q io_uring "$tmp/kvd.log"; then
		skipped "kvhttp: kvd cannot run here (io_uring)"
		summary test_http
		exit $?
	fi
	cat "$tmp/kvd.log"
	bad "kvd starts"
	summary test_http
	exit 1
fi

# A short idle timeout so the slow-loris case ends; generation itself is never cut by it.
"$KVHTTP" --listen 127.0.0.1:0 --socket "$tmp/kvd.sock" --timeout 3 --max-body 1048576 \
	--queue-timeout 600 >"$tmp/http.log" 2>&1 &
http_pid=$!
if ! wait_for "$tmp/http.log" "serving on" "$http_pid"; then
	cat "$tmp/http.log"
	bad "kvhttp starts"
	summary test_http
	exit 1
fi
url="http://$(sed -n 's/^kvhttp: serving on //p' "$tmp/http.log")"
ok "kvhttp serves on $url"

# ---- curl ----
if curl -sf "$url/health" | grep -q '"ok"'; then ok "GET /health"; else bad "GET /health"; fi
if curl -sf "$url/v1/models" | grep -q '"context_length"'; then ok "GET /v1/models"; else bad "GET /v1/models"; fi
out=$(curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' \
	-d '{"messages":[{"role":"user","content":"Say hi."}],"max_tokens":8,"temperature":0}')
if echo "$out" | grep -q '"chat.completion"' && echo "$out" | grep -q '"completion_tokens"'; then
	ok "curl chat completion"
else
	bad "curl chat completion: $out"
fi
if curl -s "$url/metrics" | grep -q '^kvd:generation_tokens_total [1-9]'; then
	ok "GET /metrics counts generated tokens"
else
	bad "GET /metrics"
fi
# /metrics carries every series kvtop --prometheus prints (the same code, tools/snap.c).
KVTOP=${KVTOP_BIN:-$(dirname "$KVD")/kvtop}
if [ -x "$KVTOP" ]; then
	"$KVTOP" --socket "$tmp/kvd.sock" --prometheus 2>/dev/null | sed -n 's/^# TYPE \([^ ]*\) .*/\1/p' | sort >"$tmp/top.names"
	curl -s "$url/metrics" | sed -n 's/^# TYPE \([^ ]*\) .*/\1/p' | sort >"$tmp/http.names"
	missing=$(comm -23 "$tmp/top.names" "$tmp/http.names" | tr '\n' ' ')
	if [ -s "$tmp/top.names" ] && [ -z "$missing" ] && grep -q '^kvd_daemon_requests_total$' "$tmp/http.names"; then
		ok "/metrics has all $(wc -l <"$tmp/top.names") series of kvtop --prometheus"
	else
		bad "/metrics lacks kvtop's series: $missing"
	fi
else
	skipped "/metrics against kvtop --prometheus: no $KVTOP"
fi
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$url/v1/models")
[ "$code" = 405 ] && ok "a wrong method: 405" || bad "a wrong method: $code"

# ---- kvload, the benchmark's load generator: 3 streaming chat clients, every token counted ----
KVLOAD=${KVLOAD_BIN:-$(dirname "$KVD")/kvload}
if [ -x "$KVLOAD" ]; then
	"$KVLOAD" --url "$url" --clients 3 --requests 6 --output-len 5 --words 8 --json >"$tmp/load.json" 2>"$tmp/load.err"
	rc=$?
	if [ $rc = 0 ] && grep -q '"requests":6,"errors":0,"output_tokens":30,' "$tmp/load.json" &&
		grep -q '"cached_tokens":0}' "$tmp/load.json"; then
		ok "kvload: 6 chat streams of 5 tokens each, none from the prefix cache"
	else
		bad "kvload: status $rc $(cat "$tmp/load.json" "$tmp/load.err")"
	fi
else
	skipped "kvload: no $KVLOAD"
fi

# ---- the openai client, in a venv of its own ----
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import openai; assert openai.__version__ == '$OPENAI_VERSION'" 2>/dev/null; then
	rm -rf "$venv"
	python3 -m venv "$venv" >"$tmp/venv.log" 2>&1 &&
		"$venv/bin/pip" install -q "openai==$OPENAI_VERSION" >>"$tmp/venv.log" 2>&1 || rm -rf "$venv"
fi
if [ -x "$venv/bin/python" ]; then
	"$venv/bin/python" tests/test_http.py "$url" openai >"$tmp/py.log" 2>&1
	cat "$tmp/py.log"
	pass=$((pass + $(grep -c '^\[       OK \]' "$tmp/py.log")))
	fail=$((fail + $(grep -c '^\[  FAILED  \]' "$tmp/py.log")))
	grep -q Traceback "$tmp/py.log" && bad "the openai checks ran to their end"
else
	cat "$tmp/venv.log"
	skipped "openai client: pip could not install openai==$OPENAI_VERSION"
fi

# ---- raw HTTP ----
python3 tests/test_http.py "$url" raw >"$tmp/raw.log" 2>&1
cat "$tmp/raw.log"
pass=$((pass + $(grep -c '^\[       OK \]' "$tmp/raw.log")))
fail=$((fail + $(grep -c '^\[  FAILED  \]' "$tmp/raw.log")))
grep -q Traceback "$tmp/raw.log" && bad "the raw HTTP checks ran to their end"

# A client gone mid-stream is cancelled: once everything settled, no KV block is held by a sequence.
i=0
while used=$("$KVCTL" --socket "$tmp/kvd.sock" stats 2>/dev/null | sed -n 's/^kv_blocks_used[ :=]*//p') &&
	[ "${used:-x}" != 0 ] && [ $i -lt 600 ]; do
	sleep 0.5
	i=$((i + 1))
done
[ "$used" = 0 ] && ok "after the hang-up and the streams, kvctl stats shows no KV block in use" ||
	bad "KV blocks still in use after the streams: $used"

# ---- kvd gone: 503; back: served again (reconnect on the next request) ----
kill "$kvd_pid"
wait "$kvd_pid" 2>/dev/null
kvd_pid=
code=$(curl -s -o "$tmp/503.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
	-d '{"prompt":"hi","max_tokens":2}')
[ "$code" = 503 ] && grep -q '"error"' "$tmp/503.json" && ok "kvd down: 503 with an error object" ||
	bad "kvd down: $code $(cat "$tmp/503.json")"
rm -f "$tmp/kvd.sock"
if start_kvd; then
	code=$(curl -s -o "$tmp/back.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
		-d '{"prompt":"hi","max_tokens":2}')
	[ "$code" = 200 ] && ok "kvd back: the next request is served" || bad "kvd back: $code $(cat "$tmp/back.json")"
else
	bad "kvd restarts"
fi

# ---- listening beyond loopback needs a key ----
if "$KVHTTP" --listen 0.0.0.0:0 --socket "$tmp/kvd.sock" >"$tmp/nokey.log" 2>&1; then
	bad "0.0.0.0 without --api-key-file is refused"
else
	grep -q "api-key-file" "$tmp/nokey.log" && ok "0.0.0.0 without --api-key-file is refused" ||
		bad "0.0.0.0 without a key: $(cat "$tmp/nokey.log")"
fi
echo "sekrit" >"$tmp/key"
"$KVHTTP" --listen 127.0.0.1:0 --socket "$tmp/kvd.sock" --api-key-file "$tmp/key" >"$tmp/key.log" 2>&1 &
key_pid=$!
if wait_for "$tmp/key.log" "serving on" "$key_pid"; then
	kurl="http://$(sed -n 's/^kvhttp: serving on //p' "$tmp/key.log")"
	a=$(curl -s -o /dev/null -w '%{http_code}' "$kurl/v1/models")
	b=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sekrit' "$kurl/v1/models")
	[ "$a" = 401 ] && [ "$b" = 200 ] && ok "--api-key-file: 401 without the key, 200 with it" ||
		bad "--api-key-file: $a $b"
else
	bad "kvhttp with --api-key-file starts"
fi
kill "$key_pid" 2>/dev/null
wait "$key_pid" 2>/dev/null

# SIGTERM ends kvhttp cleanly; an ASan build reports leaks and errors on the way out.
kill "$http_pid"
wait "$http_pid"
rc=$?
http_pid=
if [ "$rc" = 0 ] && ! grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error' "$tmp/http.log"; then
	ok "kvhttp exits 0 on SIGTERM, no sanitizer report"
else
	bad "kvhttp exit $rc or a sanitizer report"
fi

# ---- a listening socket from systemd (LISTEN_FDS), as kvhttp.socket passes it ----
if have systemd-socket-activate; then
	port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	systemd-socket-activate -l "127.0.0.1:$port" "$KVHTTP" --socket "$tmp/kvd.sock" >"$tmp/sd.log" 2>&1 &
	sd_pid=$!
	i=0
	until code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health") && [ "$code" = 200 ] ||
		[ $i -ge 600 ] || ! kill -0 "$sd_pid" 2>/dev/null; do
		sleep 0.5
		i=$((i + 1))
	done
	[ "$code" = 200 ] && grep -q "serving on 127.0.0.1:$port" "$tmp/sd.log" &&
		ok "a socket passed by systemd (LISTEN_FDS) is served" || bad "socket activation: $code $(cat "$tmp/sd.log")"
	kill "$sd_pid" 2>/dev/null
	wait "$sd_pid" 2>/dev/null
else
	skipped "socket activation: systemd-socket-activate is not installed"
fi

if [ "$fail" -ne 0 ]; then
	echo "--- kvhttp log"; tail -n 20 "$tmp/http.log"
fi
summary test_http
