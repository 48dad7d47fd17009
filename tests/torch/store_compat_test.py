"""PyTorch's own TCPStore client and process-group init against dist-rendezvous.

Run with the interpreter whose torch is under test:
    /usr/bin/python3 store_compat_test.py --rendezvous build/bin/dist-rendezvous   # torch 1.13
    python3          store_compat_test.py --rendezvous build/bin/dist-rendezvous   # torch 2.x
Exits 77 (ctest's skip code) when this interpreter has no torch.
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import time
import unittest

SKIP = 77
try:
    import torch
    import torch.distributed as dist
except ImportError:
    print(f"SKIP: {sys.executable} has no torch (scripts/install-torch2.sh installs torch 2.x)")
    sys.exit(SKIP)

RENDEZVOUS = None
TIMEOUT = datetime.timedelta(seconds=20)


class Daemon:
    """dist-rendezvous on a free port, stopped with SIGTERM and reaped."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [RENDEZVOUS, "--host", "127.0.0.1", "--port", "0", "--log-level", "warn"],
            stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        match = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if not match:
            self.stop()
            raise RuntimeError(f"dist-rendezvous did not start: {line!r}")
        self.port = int(match.group(1))

    def stop(self):
        self.proc.terminate()
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self.proc.stdout.close()


class StoreOperations(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()
        self.store = dist.TCPStore("127.0.0.1", self.daemon.port, is_master=False, timeout=TIMEOUT)

    def tearDown(self):
        del self.store
        self.assertEqual(self.daemon.stop(), 0, "dist-rendezvous must exit 0 on SIGTERM")

    def test_set_get(self):
        self.store.set("key", "value")
        self.assertEqual(self.store.get("key"), b"value")
        self.store.set("key", b"\x00\xffbinary")
        self.assertEqual(self.store.get("key"), b"\x00\xffbinary")

    def test_add(self):
        self.assertEqual(self.store.add("counter", 5), 5)
        self.assertEqual(self.store.add("counter", -2), 3)
        self.assertEqual(self.store.get("counter"), b"3")

    def test_compare_set(self):
        self.assertEqual(self.store.compare_set("cas", "", "first"), b"first")
        self.assertEqual(self.store.compare_set("cas", "wrong", "second"), b"first")
        self.assertEqual(self.store.compare_set("cas", "first", "second"), b"second")
        self.assertEqual(self.store.compare_set("missing", "expected", "x"), b"expected")

    def test_wait(self):
        other = dist.TCPStore("127.0.0.1", self.daemon.port, is_master=False, timeout=TIMEOUT)
        other.set("ready", "1")
        self.store.wait(["ready"])
        self.store.wait(["ready"], datetime.timedelta(seconds=1))

    def test_wait_timeout(self):
        start = time.monotonic()
        with self.assertRaises(Exception) as ctx:
            self.store.wait(["never-set"], datetime.timedelta(milliseconds=300))
        self.assertGreaterEqual(time.monotonic() - start, 0.25)
        self.assertIn("imeout", str(ctx.exception).replace("Timed out", "timeout"))
        # The connection is still usable after the timed-out wait.
        self.store.set("after-timeout", "ok")
        self.assertEqual(self.store.get("after-timeout"), b"ok")

    def test_check(self):
        if not hasattr(self.store, "check"):
            self.skipTest(f"torch {torch.__version__}'s Python TCPStore has no check(); the legacy "
                          "CHECK op is tested byte for byte in store_tests")
        self.store.set("a", "1")
        self.assertTrue(self.store.check(["a"]))
        self.assertFalse(self.store.check(["a", "zzz"]))

    def test_delete_num_keys(self):
        base = self.store.num_keys()
        self.store.set("a", "1")
        self.store.set("b", "2")
        self.assertEqual(self.store.num_keys(), base + 2)
        self.assertTrue(self.store.delete_key("a"))
        self.assertFalse(self.store.delete_key("a"))
        self.assertEqual(self.store.num_keys(), base + 1)


WORKER = r"""
import os, sys, datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t
dist.barrier()
print(f"rank {rank}/{world}: all_reduce={t.item()}", flush=True)
dist.destroy_process_group()
"""


class ProcessGroupInit(unittest.TestCase):
    def test_two_gloo_ranks_rendezvous_through_our_store(self):
        daemon = Daemon()
        try:
            procs = []
            for rank in range(2):
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(daemon.port),
                           TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                           GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
                procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              text=True))
            outputs = []
            for p in procs:
                try:
                    out, _ = p.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, _ = p.communicate()
                outputs.append(out)
            for rank, (p, out) in enumerate(zip(procs, outputs)):
                self.assertEqual(p.returncode, 0, f"rank {rank} failed:\n{out}")
                self.assertIn(f"rank {rank}/2: all_reduce=3.0", out)
        finally:
            self.assertEqual(daemon.stop(), 0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--require-major", type=int, default=None,
                        help="skip unless torch has this major version")
    args, rest = parser.parse_known_args()
    major = int(torch.__version__.split(".")[0])
    if args.require_major is not None and major != args.require_major:
        print(f"SKIP: {sys.executable} has torch {torch.__version__}, not {args.require_major}.x")
        sys.exit(SKIP)
    RENDEZVOUS = os.path.abspath(args.rendezvous)
    print(f"torch {torch.__version__} at {sys.executable}", flush=True)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
