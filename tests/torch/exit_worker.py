"""A worker of dist_launch.elastic whose generation watcher is woken as the process leaves
(elastic_test.py's Exit test): it starts the watcher, waits until the watcher's thread is blocked
in a receive (its wait for the next generation), says "watching", waits for a line on stdin, then
returns from its script. The test sets the key the watcher waits for while this interpreter
exits."""
import sys
import time

import torch.distributed  # noqa: F401 (as a training script would: torch is there at exit)
from dist_launch import elastic

RECEIVING = {"0", "7", "45", "47", "232", "271", "281"}  # read poll recvfrom recvmsg epoll ppoll


def in_receive(tid):
    try:
        with open(f"/proc/self/task/{tid}/syscall") as f:
            return f.read().split()[0] in RECEIVING
    except (OSError, IndexError):
        return False


elastic._this_group().watch()
watcher = elastic._this_group()._watcher
deadline, seen = time.monotonic() + 60, 0
while seen < 5 and time.monotonic() < deadline:  # five looks in a row: blocked, not passing by
    seen = seen + 1 if in_receive(watcher.native_id) else 0
    time.sleep(0.01)
print("watching" if seen >= 5 else "the watcher never blocked", flush=True)
sys.stdin.readline()
print("leaving", flush=True)
