"""What PyTorch's launcher API tests (api_test.py) get in place of their etcd v2 server and of the
in-process event recorder they mock, so that the same tests run against dist-launch's Python API
and, as the reference, torch's own elastic_launch.

  - RendezvousServer: a standalone store for the c10d rendezvous of every test, as upstream's
    EtcdServer is a standalone etcd: `dist-rendezvous --port 0` (the real port read from its
    output). torch's c10d agents find the port taken and join as clients, as dist-launch's do.
  - fresh_run_id(): a finished job's rendezvous stays closed on a store that outlives it (torch's
    c10d raises RendezvousClosedError, dist-launch says the job already finished), so each job on
    the shared store gets its own run id where upstream leaves it empty.
  - watch_events() / assert_one_job_end(): torch's launcher records one event when the run ends
    (upstream mocks torch.distributed.elastic.events.record and asserts one call); dist-launch
    writes its events to PET_EVENT_LOG, one JSON object a line, and its run's end is the one
    "job_end" event.
"""
import atexit
import json
import os
import re
import shutil
import subprocess
import tempfile
import uuid

from dist_launch import program

SERVER_START_TIMEOUT_S = 30
_LISTENING = re.compile(r"dist-rendezvous: listening on (\S+):(\d+)$")


class RendezvousServer:
    """start() / get_endpoint() / stop(), as torch's EtcdServer."""

    def __init__(self):
        self._proc = None
        self._endpoint = None

    def start(self):
        self._proc = subprocess.Popen(
            [program("dist-rendezvous"), "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        seen = []
        for line in self._proc.stdout:  # its first line names the port; EOF if it failed
            seen.append(line.rstrip())
            m = _LISTENING.search(line.rstrip())
            if m:
                self._endpoint = f"{m.group(1)}:{m.group(2)}"
                return
        self.stop()
        raise RuntimeError(f"dist-rendezvous did not start: {' | '.join(seen)}")

    def get_endpoint(self):
        return self._endpoint

    def stop(self):
        if self._proc is None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(SERVER_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc.stdout.close()
        self._proc = None


def fresh_run_id(run_id):
    return run_id or str(uuid.uuid4()).split("-")[0]


_EVENTS_DIR = tempfile.mkdtemp(prefix="torchrun-compat-events-")
atexit.register(shutil.rmtree, _EVENTS_DIR, True)


def watch_events():
    """A fresh event log for the next launch: PET_EVENT_LOG, which dist-launch reads as
    --event-log (torch's launcher ignores it)."""
    path = os.path.join(_EVENTS_DIR, f"{uuid.uuid4().hex}.jsonl")
    os.environ["PET_EVENT_LOG"] = path
    return path


def assert_one_job_end(test):
    """As upstream's `record_mock.assert_called_once()`: the run recorded its end once."""
    path = os.environ.get("PET_EVENT_LOG", "")
    with open(path) as f:
        events = [json.loads(line) for line in f if line.strip()]
    ends = [e for e in events if e.get("event") == "job_end"]
    test.assertEqual(1, len(ends), f"job_end events in {path}: {ends}")
