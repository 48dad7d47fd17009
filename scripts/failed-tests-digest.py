#!/usr/bin/env python3
"""After a failing ctest run: each failed test's own failure lines, from Testing/Temporary/
LastTest.log, printed together at the end (CI shows a log's tail; a test that failed early in a
45-minute run is out of it, its output thousands of lines up).

    python3 scripts/failed-tests-digest.py BUILD_DIR [--lines N]
"""
import argparse
import os
import re
import sys

# Lines that say why: gtest's failures and their values, unittest's, Python's exceptions, and the
# launcher's own errors.
TELLING = re.compile(r"Failure|Which is|Expected|actual|FAIL:|ERROR:|Error\b|Traceback|"
                     r"\bassert|\[dist-launch\] error|Timeout|timed out|Killed|Segmentation")


def sections(log):
    """(test name, output lines) of every test in LastTest.log."""
    name, lines, inside = None, [], False
    for line in log:
        line = line.rstrip("\n")
        m = re.match(r"\d+/\d+ Testing: (.+)$", line)
        if m:
            name, lines, inside = m.group(1), [], False
        elif line == "Output:" and name:
            inside = True
        elif line == "<end of output>" and name:
            yield name, lines
            name, inside = None, False
        elif inside and not (not lines and set(line) == {"-"}):  # (the rule under "Output:")
            lines.append(line)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build_dir")
    p.add_argument("--lines", type=int, default=25, help="the most lines shown per failed test")
    args = p.parse_args()
    temporary = os.path.join(args.build_dir, "Testing", "Temporary")
    try:
        with open(os.path.join(temporary, "LastTestsFailed.log")) as f:
            failed = {line.strip().split(":", 1)[1] for line in f if ":" in line}
        with open(os.path.join(temporary, "LastTest.log"), errors="replace") as f:
            found = {name: lines for name, lines in sections(f) if name in failed}
    except OSError as e:
        print(f"failed-tests-digest: {e}", file=sys.stderr)
        return 0
    print(f"== the {len(failed)} failed test(s), their failure lines (the whole output is above)")
    for name in sorted(failed):
        lines = found.get(name, [])
        telling = [line for line in lines if TELLING.search(line)]
        shown = (telling or lines)[-args.lines:]
        print(f"-- {name}: {len(lines)} lines of output, {len(telling)} that say why")
        for line in shown:
            print(f"   {line[:400]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
