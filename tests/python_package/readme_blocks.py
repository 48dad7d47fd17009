"""README.md's shell blocks as a newcomer runs them, for the tests that execute them literally.

A block the tests run is the fenced ```sh block right after a line `<!-- readme-test: NAME -->`
(invisible once rendered). The tests take its text from README.md as it is, so a README that
drifts from the product fails them. They run a block in a fresh copy of the working tree (what
git tracks, plus the files it would add: no build tree, no venv), through `bash -e`, as one
session: a failed line fails the test.
"""
import os
import re
import shutil
import signal
import subprocess

MARK = re.compile(r"^<!-- readme-test: ([a-z0-9-]+) -->$")
FENCE = "```"


class Block:
    def __init__(self, name, line, text):
        self.name, self.line, self.text = name, line, text

    def commands(self):
        """The block's commands: its lines without comments, continuations joined."""
        joined = re.sub(r"\\\n\s*", " ", self.text)
        return [c for c in (line.split("#")[0].strip() for line in joined.splitlines()) if c]


def sh_blocks(readme):
    """Every fenced sh block: (line of its fence, its section's title, its mark or None, text)."""
    with open(readme) as f:
        lines = f.read().splitlines()
    found, section, mark, i = [], "", None, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        m = MARK.match(line.strip())
        if m:
            mark = m.group(1)
        elif line.startswith(FENCE):
            end = i + 1
            while end < len(lines) and not lines[end].startswith(FENCE):
                end += 1
            if line.strip() == FENCE + "sh":
                found.append((i + 1, section, mark, "\n".join(lines[i + 1:end]) + "\n"))
            mark, i = None, end
        elif line.strip():
            mark = None  # a mark holds only for the fence right after it
        i += 1
    return found


def blocks(readme):
    """The marked blocks by name."""
    named = {}
    for line, _, mark, text in sh_blocks(readme):
        if mark:
            if mark in named:
                raise ValueError(f"README.md: two blocks marked readme-test: {mark}")
            named[mark] = Block(mark, line, text)
    return named


def block(readme, name):
    found = blocks(readme).get(name)
    if found is None:
        raise LookupError(f"README.md has no sh block marked <!-- readme-test: {name} -->: the "
                          "test runs the block a newcomer is told to run; mark it again")
    return found


def fresh_copy(source, dest):
    """The working tree as a fresh clone has it, with its uncommitted changes: the files git
    tracks and the untracked ones it does not ignore, modification times kept (so that a build
    tree made from an earlier copy at `dest` rebuilds only what changed). Returns None, or why
    it cannot (not a git checkout)."""
    try:
        listed = subprocess.run(["git", "-C", source, "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        return f"cannot list {source}'s files with git: {e}"
    shutil.rmtree(dest, ignore_errors=True)
    for name in sorted(set(listed.decode().split("\0")) - {""}):
        src, dst = os.path.join(source, name), os.path.join(dest, name)
        if not os.path.lexists(src):
            continue  # deleted in the working tree, not yet in git
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isfile(src):
            shutil.copy2(src, dst)
    return None


# Each top-level command of the blocks (not those of the scripts they source) on stderr, with the
# time: `readme-test: <seconds since the epoch> <command>`.
TIMESTAMPS = ("trap '[ -n \"${BASH_SOURCE[0]:-}\" ] || "
              "echo \"readme-test: $EPOCHREALTIME $BASH_COMMAND\" >&2' DEBUG\n")
BLOCK_START = "readme-test: block "


def run_session(named_blocks, cwd, env, timeout_s):
    """Runs the blocks one after the other in one `bash -e` session (one terminal: a venv
    activated by one block stays active in the next), in a process group of its own that is
    killed at the end, whatever the blocks left running. Returns (exit code or None when it
    timed out, stdout, stderr); each block's output starts with a line `readme-test: block NAME`
    on both streams."""
    script = TIMESTAMPS
    for b in named_blocks:
        script += (f"trap - DEBUG\necho '{BLOCK_START}{b.name}'; echo '{BLOCK_START}{b.name}' >&2\n"
                   + TIMESTAMPS + b.text)
    script += "trap - DEBUG\necho \"readme-test: $EPOCHREALTIME (end)\" >&2\n"
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return code, out, err


def split_by_block(text):
    """{block name: its part of a session's stdout or stderr}."""
    parts, name = {}, None
    for line in text.splitlines(keepends=True):
        if line.startswith(BLOCK_START):
            name = line[len(BLOCK_START):].strip()
            parts[name] = ""
        elif name is not None:
            parts[name] += line
    return parts


def command_times(stderr):
    """[(seconds since the session began, seconds it took, command)] from the session's
    timestamps (a command's time runs to the next one's start, the last one's to the end)."""
    stamps = []
    for line in stderr.splitlines():
        m = re.match(r"readme-test: ([0-9]+[.,][0-9]+) (.*)$", line)
        if m and not m.group(2).startswith(("echo 'readme-test", "trap ")):
            stamps.append((float(m.group(1).replace(",", ".")), m.group(2)))
    return [(t - stamps[0][0], stamps[i + 1][0] - t, c)
            for i, (t, c) in enumerate(stamps[:-1])]


def release_build(build_dir):
    """None when `build_dir` is a Release build tree (scripts/wheel.sh packs only those), else why
    the wheel cannot come from it."""
    try:
        with open(os.path.join(build_dir, "CMakeCache.txt")) as f:
            found = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", f.read(), re.M)
    except OSError:
        return f"{build_dir} is not a CMake build tree"
    kind = found.group(1) if found else ""
    if kind == "Release":
        return None
    return f"{build_dir} is a '{kind}' build: the wheel packs a Release build's programs"
