"""The pinned upstream files of the compatibility suite (upstream.json): where they come from and
whether a copy on disk is exactly what was pinned."""
import hashlib
import json
import os

MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream.json")


def manifest():
    with open(MANIFEST) as f:
        return json.load(f)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def problems(root):
    """What keeps the copy under `root` from being the pinned one: [] when it is."""
    found = []
    for entry in manifest()["files"]:
        path = os.path.join(root, entry["path"])
        if not os.path.isfile(path):
            found.append(f"{entry['path']}: missing")
        elif sha256(path) != entry["sha256"]:
            found.append(f"{entry['path']}: not the file of commit {entry['commit']} "
                         f"(SHA-256 {sha256(path)}, pinned {entry['sha256']})")
    return found
