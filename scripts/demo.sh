#!/usr/bin/env bash
# Sets up and runs the main job. Until the agent lands this shows the launcher's command line and
# a round trip through a standalone rendezvous store.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/install-deps.sh" >/dev/null
"$root/scripts/build.sh" >/dev/null
bin=${BUILD_DIR:-$root/build}/bin

"$bin/dist-launch" --help
echo
echo "== dist-rendezvous on a free port, used by torch 1.13 as its TCPStore =="
out=$(mktemp)
"$bin/dist-rendezvous" --host 127.0.0.1 --port 0 --log-level warn >"$out" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$out"' EXIT
for _ in $(seq 50); do grep -q listening "$out" && break; sleep 0.1; done
cat "$out"
port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$out")
/usr/bin/python3 - "$port" <<'PY'
import sys, datetime
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False,
                      timeout=datetime.timedelta(seconds=10))
store.set("greeting", "hello from torch " + __import__("torch").__version__)
print(store.get("greeting").decode(), "| counter:", store.add("counter", 41) + store.add("counter", 1) - 41)
PY
