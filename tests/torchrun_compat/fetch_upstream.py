#!/usr/bin/env python3
"""Fetches the upstream files the compatibility suite runs (upstream.json), each at its pinned
commit, into DEST (laid out as in the pytorch repository), and checks their SHA-256.

    tests/torchrun_compat/fetch_upstream.py DEST                        # from GitHub
    tests/torchrun_compat/fetch_upstream.py DEST --pytorch-checkout DIR # from a local clone

Then point the suite at DEST: DIST_TORCHRUN_COMPAT_UPSTREAM=DEST (or the CMake cache variable of
that name). The files are PyTorch's (BSD-3-Clause), fetched rather than kept in this repository.
"""
import argparse
import os
import stat
import subprocess
import sys
import urllib.request

import upstream

RAW_URL = "https://raw.githubusercontent.com/{repo}/{commit}/{path}"
DOWNLOAD_TIMEOUT_S = 60


def content(entry, repo, checkout):
    if checkout:
        return subprocess.run(["git", "-C", checkout, "show", f"{entry['commit']}:{entry['path']}"],
                              check=True, capture_output=True).stdout
    url = RAW_URL.format(repo=repo, commit=entry["commit"], path=entry["path"])
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as reply:
        return reply.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest")
    parser.add_argument("--pytorch-checkout", help="a clone of pytorch/pytorch to read from")
    args = parser.parse_args()
    pinned = upstream.manifest()
    if not upstream.problems(args.dest):
        print(f"fetch_upstream: the {len(pinned['files'])} pinned files are already in {args.dest}")
        return 0
    for entry in pinned["files"]:
        target = os.path.join(args.dest, entry["path"])
        os.makedirs(os.path.dirname(target), exist_ok=True)
        try:
            data = content(entry, pinned["repository"], args.pytorch_checkout)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"fetch_upstream: cannot fetch {entry['path']} at {entry['commit']}: {e}",
                  file=sys.stderr)
            return 1
        with open(target, "wb") as f:
            f.write(data)
        if entry.get("executable"):
            os.chmod(target, os.stat(target).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    wrong = upstream.problems(args.dest)
    for problem in wrong:
        print(f"fetch_upstream: {problem}", file=sys.stderr)
    if not wrong:
        print(f"fetch_upstream: {len(pinned['files'])} files of {pinned['repository']} in {args.dest}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
