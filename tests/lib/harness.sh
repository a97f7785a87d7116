# harness.sh — what the shell suites share: counters, cmocka-like result lines, a summary.
# Source it after setting nothing; call `summary NAME` last (its status is the suite's).
pass=0
fail=0
skip=0
ok() { pass=$((pass + 1)); echo "[       OK ] $1"; }
bad() { fail=$((fail + 1)); echo "[  FAILED  ] $1"; }
skipped() { skip=$((skip + 1)); echo "[  SKIPPED ] $1"; }
have() { command -v "$1" >/dev/null 2>&1; }
summary() {
	echo "$1: $pass passed, $fail failed, $skip skipped"
	[ "$fail" -eq 0 ]
}
