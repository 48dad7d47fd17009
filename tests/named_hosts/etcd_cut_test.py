"""A node of an elastic job over etcd (--rdzv-backend etcd-v3) whose link is cut for 20 s stops
its workers and rejoins the job when the link returns, as over the TCP store: both nodes exit 0,
its event log has one job_start, a rejoin and one job_end (succeeded). Before, it exited 1 at the
10th second of the cut and never came back (docs/BENCHMARKS.md, "A node cut off from etcd").
Runs bench/etcd_cut.sh (two named hosts of its own, etcd 3.4 on one of them).

    python3 etcd_cut_test.py --bin build/bin --script bench/etcd_cut.sh
Exits 77 (skip) where it cannot run: not root, no etcd or no ip(8).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ARGS = None


def sections(text):
    """The script's '== NAME' sections: NAME -> their text."""
    found, name = {}, None
    for line in text.splitlines():
        if line.startswith("== "):
            name = line[3:].split()[0]
            found[name] = []
        elif name:
            found[name].append(line)
    return {k: "\n".join(v) for k, v in found.items()}


class EtcdCut(unittest.TestCase):
    def test_a_node_cut_off_from_etcd_rejoins_when_its_link_returns(self):
        out_dir = tempfile.mkdtemp(prefix="dist-etcd-cut-")
        self.addCleanup(shutil.rmtree, out_dir, ignore_errors=True)
        env = dict(os.environ, BIN=ARGS.bin, OUT_DIR=out_dir)
        proc = subprocess.run(["bash", ARGS.script, "rejoin", "20", "join_timeout=60"], env=env,
                              capture_output=True, text=True, timeout=400)
        everything = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, everything)
        self.assertIn("both in a world of 2 again", everything)
        said = sections(proc.stdout)
        self.assertIn("EXIT CODE 0", said.get("a.log", ""), everything)
        self.assertIn("EXIT CODE 0", said.get("b.log", ""), everything)
        self.assertIn("no etcd member answered: this host was cut off from them", said["b.log"],
                      everything)
        self.assertIn("rejoining the job", said["b.log"], everything)
        with open(os.path.join(out_dir, "run-rejoin", "b.events")) as f:
            events = [json.loads(line) for line in f]
        names = [e["event"] for e in events if e["event"] in ("job_start", "rejoin", "job_end")]
        self.assertEqual(names, ["job_start", "rejoin", "job_end"], everything)
        self.assertEqual(events[-1]["outcome"], "succeeded", everything)


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True, help="the directory of dist-launch")
    p.add_argument("--script", required=True, help="bench/etcd_cut.sh")
    ARGS, rest = p.parse_known_args()
    if os.geteuid() != 0 or not shutil.which("etcd") or not shutil.which("ip"):
        print("skip: needs root, etcd (Debian's etcd-server) and ip(8)", file=sys.stderr)
        return 77
    ARGS.bin = os.path.abspath(ARGS.bin)
    result = unittest.main(argv=[sys.argv[0], "-v", *rest], exit=False).result
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
