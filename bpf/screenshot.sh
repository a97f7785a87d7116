#!/bin/sh
# screenshot.sh — capture bpf/kvtop.png: a kvd under load from two uids, kvtop in
# an xterm on a virtual X server (xvfb, xterm, x11-apps, imagemagick). Run as root.
set -eu
out=${1:-bpf/kvtop.png}
d=$(mktemp -d /tmp/kvd-shot.XXXXXX)
chmod 755 "$d"
sock=$d/kvd.sock
pids=""
cleanup() {
	for p in $pids; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$d"
}
trap cleanup EXIT INT TERM
build/kvd --socket "$sock" --socket-group nogroup --kv-blocks 512 --threads 1 --bpf=on >"$d/kvd.log" 2>&1 &
kvd=$!
pids="$kvd"
while ! [ -S "$sock" ]; do sleep 0.2; done
build/kvbench --socket "$sock" -c 2 -d 60 -p 48:96 -o 24:64 --shared-prefix 32 >/dev/null 2>&1 &
pids="$pids $!"
setpriv --reuid=65534 --regid=65534 --clear-groups \
	build/kvbench --socket "$sock" -c 1 -d 60 -p 16:32 -o 16:32 --seed 7 >/dev/null 2>&1 &
pids="$pids $!"
Xvfb :77 -screen 0 1280x800x24 -nolisten tcp >/dev/null 2>&1 &
pids="$pids $!"
sleep 2
DISPLAY=:77 xterm -geometry 104x34+0+0 -fa 'DejaVu Sans Mono' -fs 11 -bg '#101418' -fg '#d8dee9' \
	-xrm 'XTerm*color2: #50c878' -xrm 'XTerm*color3: #e0b040' -xrm 'XTerm*color6: #60b0d0' \
	-e build/kvtop --socket "$sock" &
pids="$pids $!"
sleep "${SHOT_AFTER:-25}"
xwd -display :77 -root -silent | convert xwd:- -trim +repage -bordercolor "#101418" -border 12 "$out"
kill "$kvd"
echo "wrote $out"
