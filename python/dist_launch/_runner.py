"""Runs dist-launch as a child of this Python process: its output goes on to sys.stdout and
sys.stderr (so a notebook shows it), its stderr is watched for the rank assignment and the failure
report, and the stop signals this process receives reach it exactly once."""
from __future__ import annotations

import codecs
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Deque, List, Optional, Sequence

from ._programs import program
from .errors import RULE, FailureReport, parse_report

# After dist-launch has exited, how long its output may take to drain: a leftover process that
# kept its stdout open must not hang the caller.
OUTPUT_DRAIN_TIMEOUT_S = 5.0
# The agent's own error lines kept for a LaunchError's message.
ERROR_LINES_KEPT = 20

_ROUND = re.compile(r"^\[dist-launch\] info: round (\d+): node (\d+) of (\d+), "
                    r"global ranks (\d+)\.\.(\d+) of (\d+)$")
_AGENT_ERROR = re.compile(r"^(?:\[dist-launch\] (?:error|critical): |dist-launch: error: )(.*)$")
_PR_SET_PDEATHSIG = 1


@dataclass
class Outcome:
    exit_code: int  # dist-launch's; -N when signal N ended it
    node_ranks: Optional[range]  # this node's global ranks in the last round, when it was logged
    report: Optional[FailureReport]
    errors: List[str]  # the agent's last error lines
    forwarded_signal: Optional[int]  # a stop signal this process passed on


@dataclass
class _StderrWatch:
    node_ranks: Optional[range] = None
    report_lines: List[str] = field(default_factory=list)
    reports: List[List[str]] = field(default_factory=list)
    errors: Deque[str] = field(default_factory=lambda: deque(maxlen=ERROR_LINES_KEPT))
    _in_report: bool = False

    def feed(self, line: str) -> None:
        if self._in_report:
            self.report_lines.append(line)
            # A report ends with the rule after its root cause.
            if line == RULE and any(x.startswith("Root Cause") for x in self.report_lines):
                self.reports.append(self.report_lines)
                self.report_lines, self._in_report = [], False
            return
        if line.endswith(" FAILED") and self.report_lines == [RULE]:
            self.report_lines.append(line)
            self._in_report = True
            return
        self.report_lines = [line] if line == RULE else []
        m = _ROUND.match(line)
        if m:
            self.node_ranks = range(int(m.group(4)), int(m.group(5)) + 1)
        e = _AGENT_ERROR.match(line)
        if e:
            self.errors.append(e.group(1))

    def report(self) -> Optional[FailureReport]:
        for lines in reversed(self.reports):
            try:
                return parse_report(lines)
            except ValueError:
                continue
        return None


def _pump(source: IO[bytes], sink: IO[str], watch: Optional[_StderrWatch]) -> None:
    """Copies what dist-launch writes as it comes (a prompt without its newline too), and feeds
    the watch whole lines."""
    raw = getattr(sink, "buffer", None)
    to_sink = codecs.getincrementaldecoder("utf-8")(errors="replace")
    to_watch = codecs.getincrementaldecoder("utf-8")(errors="replace")
    line = ""
    while True:
        data = os.read(source.fileno(), 65536)
        if not data:
            break
        try:
            if raw is not None:
                sink.flush()  # (what was written to the text layer first)
                raw.write(data)
            elif sink is not None:  # (None: Python's stream closed before it started)
                sink.write(to_sink.decode(data))
                sink.flush()
        except (OSError, ValueError):  # a closed console: keep draining, keep watching
            pass
        if watch is not None:
            *lines, line = (line + to_watch.decode(data)).split("\n")
            for whole in lines:
                watch.feed(whole)
    if watch is not None and line:
        watch.feed(line)
    source.close()


def _libc_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def run_dist_launch(argv: Sequence[str], env: dict, forward_signals: Sequence[int]) -> Outcome:
    """Runs `dist-launch argv` to its end. From the main thread, dist-launch gets a process group
    of its own, and `forward_signals` received here are passed on to it once each (a terminal's
    Ctrl-C would otherwise reach it twice, and a second SIGINT means "kill the workers now")."""
    path = program("dist-launch")
    main_thread = threading.current_thread() is threading.main_thread()
    prctl = _libc_prctl()

    def in_child() -> None:
        if prctl is not None:  # dist-launch stops its workers when this process dies
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if main_thread:
            os.setpgid(0, 0)

    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    if not main_thread:
        warnings.warn("dist_launch: launched from a thread other than the main one: a signal "
                      "this process receives is not passed on to the job (Python takes signals "
                      "in its main thread only; a terminal's Ctrl-C reaches it all the same)",
                      RuntimeWarning, stacklevel=3)
    # stdin is the caller's, as under torchrun (a worker's breakpoint(), input()).
    proc = subprocess.Popen([path, *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=in_child)
    watch = _StderrWatch()
    pumps = [threading.Thread(target=_pump, args=(proc.stdout, sys.stdout, None), daemon=True),
             threading.Thread(target=_pump, args=(proc.stderr, sys.stderr, watch), daemon=True)]
    for t in pumps:
        t.start()

    forwarded: List[int] = []
    previous = {}
    if main_thread:
        def forward(signum, _frame):
            forwarded.append(signum)
            if proc.poll() is None:
                proc.send_signal(signum)

        for s in forward_signals:
            previous[s] = signal.signal(s, forward)
    try:
        exit_code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    for t in pumps:
        t.join(OUTPUT_DRAIN_TIMEOUT_S)
    return Outcome(exit_code=exit_code, node_ranks=watch.node_ranks, report=watch.report(),
                   errors=list(watch.errors),
                   forwarded_signal=forwarded[0] if forwarded else None)
