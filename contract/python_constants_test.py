#!/usr/bin/env python3
"""contract/python_constants.py: the Python package's constants are the headers' own.

Checks the source tree's blocks are current, that the slot's layout it computes is the one the
C++ compiler asserts (worker_contract.h's static_assert), and, on a copy of the tree, that a value
changed in a header is caught by --check and written by a run, and that a block naming no
constant of the contract is an error naming its line.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOL = os.path.join(HERE, "python_constants.py")
sys.path.insert(0, HERE)
import python_constants  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True,
                          timeout=60)


class PythonConstants(unittest.TestCase):
    def test_the_source_trees_blocks_are_current(self):
        result = run("--check")
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_the_slots_offsets_are_the_ones_the_compiler_asserts(self):
        header = open(os.path.join(ROOT, "contract", "include", "dist", "contract",
                                   "worker_contract.h")).read()
        asserted = re.findall(r"offsetof\(Slot, (\w+)\) == (\d+)", header)
        self.assertGreaterEqual(len(asserted), 10)
        values = python_constants.constants()
        for field, offset in asserted:
            self.assertEqual(values["SLOT_OFFSET_" + field.upper()], int(offset), field)
        self.assertEqual(values["SLOT_MAGIC"].to_bytes(8, "little"), b"DISTHB01")

    def copy_of_the_tree(self):
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        shutil.copytree(os.path.join(ROOT, "contract", "include"),
                        os.path.join(root, "contract", "include"))
        shutil.copytree(os.path.join(ROOT, "python", "dist_launch"),
                        os.path.join(root, "python", "dist_launch"))
        return root

    def test_a_changed_header_is_caught_then_written(self):
        root = self.copy_of_the_tree()
        header = os.path.join(root, "contract", "include", "dist", "contract",
                              "worker_contract.h")
        text = open(header).read()
        open(header, "w").write(text.replace('"DIST_LAUNCH_GENERATION"', '"DIST_GEN_2"'))
        elastic = os.path.join(root, "python", "dist_launch", "elastic.py")

        caught = run("--check", "--root", root)
        self.assertEqual(caught.returncode, 1)
        self.assertIn("elastic.py", caught.stderr)
        self.assertIn("DIST_GEN_2", caught.stderr)
        self.assertNotIn("DIST_GEN_2", open(elastic).read(), "--check changed a file")

        self.assertEqual(run("--root", root).returncode, 0)
        self.assertIn('_GENERATION_VARIABLE = "DIST_GEN_2"', open(elastic).read())
        self.assertEqual(run("--check", "--root", root).returncode, 0)

    def test_a_name_that_is_no_constant_is_an_error_naming_its_line(self):
        root = self.copy_of_the_tree()
        snapshot = os.path.join(root, "python", "dist_launch", "snapshot.py")
        text = open(snapshot).read()
        open(snapshot, "w").write(text.replace("SNAPSHOT_FORMAT = ", "SNAPSHOT_FROMAT = "))
        result = run("--check", "--root", root)
        self.assertNotEqual(result.returncode, 0)
        self.assertRegex(result.stderr, r"snapshot\.py:\d+: no constant of the contract is "
                                        r"called 'SNAPSHOT_FROMAT'")


if __name__ == "__main__":
    unittest.main()
