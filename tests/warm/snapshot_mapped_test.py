#!/usr/bin/env python3
"""dist_launch.snapshot's loads map the file instead of copying it, in one process (no agent: the
variables an agent sets point at a scratch folder in /dev/shm).

    python3 tests/warm/snapshot_mapped_test.py [--torch]

A load returns arrays that are views of the snapshot's own pages (private, copy-on-write): no
second copy of the state in memory. What that must never cost: a write to a loaded array reaching
the file; a later save recycling the file under arrays still in use (it makes a new one instead);
a load of a file a save is rewriting.
"""
import argparse
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"))

import numpy as np  # noqa: E402

from dist_launch import snapshot  # noqa: E402

WITH_TORCH = False


def mappings_of(path):
    """The lines of /proc/self/maps that map `path` (deleted or not)."""
    inode = str(os.stat(path).st_ino) if os.path.exists(path) else None
    with open("/proc/self/maps") as f:
        return [line for line in f if path in line or (inode and f" {inode} " in line)]


def address_in_mapping(address, path):
    for line in mappings_of(path):
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        if start <= address < end:
            return True
    return False


class MappedLoads(unittest.TestCase):
    def setUp(self):
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.root = tempfile.mkdtemp(prefix="dist-launch-test-", dir=base)
        self.addCleanup(shutil.rmtree, self.root, True)
        saved = dict(os.environ)
        self.addCleanup(lambda: (os.environ.clear(), os.environ.update(saved)))
        os.environ.update({"DIST_LAUNCH_SNAPSHOT_DIR": self.root, "TORCHELASTIC_RUN_ID": "mapped",
                           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                           "DIST_LAUNCH_SNAPSHOT_RUN": "test-run"})
        os.environ.pop("DIST_LAUNCH_SNAPSHOT_MEMORY", None)
        os.environ.pop("DIST_LAUNCH_SNAPSHOT_PERSIST_DIR", None)

    def path_of(self, step):
        return os.path.join(self.root, "rank_0", snapshot._step_name(step))

    def weights(self, value):
        if WITH_TORCH:
            import torch
            return torch.full((256, 1024), float(value))
        return np.full((256, 1024), float(value))

    def data_address(self, array):
        return array.data_ptr() if WITH_TORCH else array.ctypes.data

    def test_a_load_is_a_view_of_the_file_not_a_copy(self):
        self.assertTrue(snapshot.save(5, {"w": self.weights(5), "step": 5}))
        path = self.path_of(5)
        self.assertTrue(os.path.exists(path), os.listdir(os.path.join(self.root, "rank_0")))
        step, state = snapshot.load()
        self.assertEqual(step, 5)
        self.assertTrue(address_in_mapping(self.data_address(state["w"]), path),
                        "the loaded array is not in a mapping of the snapshot file")
        self.assertEqual(float(state["w"][3, 7]), 5.0)

    def test_writing_a_loaded_array_never_reaches_the_file(self):
        snapshot.save(5, {"w": self.weights(5)})
        _, state = snapshot.load()
        state["w"][:] = 99.0  # training in place on the loaded tensor
        del state
        _, again = snapshot.load()
        self.assertEqual(float(again["w"].max()), 5.0)

    def test_a_save_never_recycles_a_file_a_load_still_maps(self):
        snapshot.save(1, {"w": self.weights(1)})
        snapshot.save(2, {"w": self.weights(2)})
        _, one = snapshot.load(1)  # held: e.g. frozen parameters taken from the snapshot
        # Each rank keeps two: step 3 would recycle step 1's file, which `one` maps.
        snapshot.save(3, {"w": self.weights(3)})
        self.assertEqual(float(one["w"].min()), 1.0)
        self.assertEqual(float(one["w"].max()), 1.0)
        self.assertFalse(os.path.exists(self.path_of(1)), "step 1 is not one of the two kept")
        self.assertEqual(snapshot.load(3)[1]["w"][0, 0], 3.0)
        del one  # once nothing maps a file, its memory is recycled again
        snapshot.save(4, {"w": self.weights(4)})
        self.assertEqual(sorted(snapshot.steps()), [3, 4])

    def test_a_file_being_rewritten_is_not_loaded(self):
        snapshot.save(7, {"w": self.weights(7)})
        held = snapshot._hold_unmapped(self.path_of(7))  # what a save holds while it recycles
        self.assertIsNotNone(held)
        try:
            self.assertIsNone(snapshot.load(7))
        finally:
            os.close(held)
        self.assertEqual(snapshot.load(7)[0], 7)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch", action="store_true", help="torch tensors instead of numpy arrays")
    args, rest = ap.parse_known_args()
    if args.torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("SKIP: no torch in this interpreter", file=sys.stderr)
            sys.exit(77)
        WITH_TORCH = True
    unittest.main(argv=[sys.argv[0]] + rest)
