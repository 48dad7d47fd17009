#!/usr/bin/env python3
"""Runs dist-store-bench against our store and PyTorch's servers in one run; prints a Markdown table.

    python3 bench/run_store_bench.py [--build build] [--seconds 2] [--out results.jsonl]

Servers: dist-rendezvous (both dialects), torch 1.13's legacy TCPStore server (Debian's
/usr/bin/python3) and, when `python3` has torch 2.x (scripts/install-torch2.sh), its libuv server.
"""
import argparse
import json
import os
import re
import subprocess
import sys

TORCH_SERVER = r"""
import sys, time, datetime, torch.distributed as d
kw = {"use_libuv": True} if sys.argv[1] == "libuv" else {}
s = d.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
               timeout=datetime.timedelta(seconds=60), **kw)
print("port", s.port, flush=True)
time.sleep(3600)
"""


def start(cmd, pattern):
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    m = re.search(pattern, line)
    if not m:
        proc.kill()
        raise RuntimeError(f"server {cmd[0]} did not start: {line!r}")
    return proc, int(m.group(1))


def torch_version(python):
    try:
        return subprocess.run([python, "-c", "import torch; print(torch.__version__)"],
                              capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


MATRIX = [("roundtrip", n) for n in (1, 16, 64, 1000, 10000)] + \
         [("pipelined", n) for n in (1, 16, 64, 1000)] + \
         [("storm", 1000), ("storm", 10000), ("slowloris", 16), ("idle", 10000)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--out", default=None, help="also write the raw JSON lines here")
    args = ap.parse_args()
    bench = os.path.join(args.build, "bin", "dist-store-bench")

    # Each server kind as (label, dialect, command, pattern of its "listening" line). Every row of
    # the matrix gets a fresh server process, so no run inherits another's state or memory.
    ours = [os.path.join(args.build, "bin", "dist-rendezvous"), "--host", "127.0.0.1", "--port",
            "0", "--log-level", "error"]
    kinds = [("dist-rendezvous", "current", ours, r":(\d+)$"),
             ("dist-rendezvous", "legacy", ours, r":(\d+)$")]
    v1 = torch_version("/usr/bin/python3")
    if v1:
        kinds.append((f"torch {v1} (legacy server)", "legacy",
                      ["/usr/bin/python3", "-c", TORCH_SERVER, "legacy"], r"port (\d+)"))
    v2 = torch_version("python3")
    if v2.startswith("2."):
        kinds.append((f"torch {v2} (libuv server)", "current",
                      ["python3", "-c", TORCH_SERVER, "libuv"], r"port (\d+)"))
    else:
        print("note: no torch 2.x in python3; scripts/install-torch2.sh adds it", file=sys.stderr)

    results = []
    for mode, clients in MATRIX:
        for label, dialect, command, pattern in kinds:
            proc, port = start(command, pattern)
            try:
                cmd = [bench, "--port", str(port), "--dialect", dialect, "--mode", mode,
                       "--clients", str(clients), "--seconds", str(args.seconds),
                       "--timeout", "30", "--server-pid", str(proc.pid), "--label", label]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
                line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
                r = json.loads(line)
                r["label"] = label
                results.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
            finally:
                proc.kill()
                proc.wait()
    if args.out:
        with open(args.out, "w") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    print(render(results))


TIMED_MODES = ("roundtrip", "pipelined", "slowloris")


def render(results):
    rows = ["| mode | clients | server | dialect | ops/s | p50 ms | p99 ms | connect s | wall s "
            "| server peak RSS MiB | note |",
            "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        timed = r["mode"] in TIMED_MODES
        served = timed and r.get("ops", 0) > 0
        note = ""
        if timed and not served:
            note = "stalled: no request completed"
        elif not timed and r.get("errors"):
            note = f"did not finish: {r['completed']}/{r['clients']} clients done"
        elif r["mode"] == "idle":
            note = f"{r['idle_bytes_per_conn'] / 1024:.2f} KiB per idle connection"
        cells = [r["mode"], f"{r['clients']:,}", r["label"], r["dialect"],
                 f"{r['ops_per_s']:,.0f}" if timed else "",
                 f"{r['p50_ms']:.3f}" if served else "",
                 f"{r['p99_ms']:.3f}" if served else "",
                 f"{r['connect_s']:.3f}", f"{r['seconds']:.3f}",
                 f"{r['server_hwm_kib'] / 1024:.1f}", note]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
