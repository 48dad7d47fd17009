"""What a failed launch raises, in torch.distributed.elastic's terms: ChildFailedError carries the
failed workers (ProcessFailure, by global rank) and the root cause, read from the failure report
dist-launch prints (the same layout as torchrun's)."""
from __future__ import annotations

import dataclasses
import json
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


@dataclass
class ProcessFailure:
    """One failed worker, with the fields of torch's ProcessFailure plus its host and rank."""

    rank: int  # global rank
    local_rank: int
    host: str
    pid: int
    exitcode: int  # the worker's exit status, or -N when signal N ended it (as torch's)
    error_file: str  # "" when the worker wrote none
    message: str  # from the error file (torch's @record, the SDK's write_error_file)
    traceback: str
    timestamp: int  # seconds since the epoch (whole seconds, as the report prints it)

    @property
    def error_file_data(self) -> dict:
        """The error file's JSON, as torch's ProcessFailure.error_file_data has it: {} when the
        worker wrote none or it is gone (dist-launch keeps a failed run's directory)."""
        if not self.error_file:
            return {}
        try:
            with open(self.error_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def signal_name(self) -> str:
        """The signal's name when a signal ended the worker (SIGKILL), else "<N/A>"."""
        if self.exitcode >= 0:
            return "<N/A>"
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


class LaunchError(RuntimeError):
    """dist-launch failed. `exit_code` is its exit status; the message is its own error lines."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):  # (pickled whole: a launch in a process pool raises it in the caller)
        return type(self), (str(self), self.exit_code)


class UsageError(LaunchError, ValueError):
    """The configuration or command line was refused before anything started (exit code 2)."""


class SignalException(LaunchError):
    """The launch was stopped by a signal this process received and passed on to dist-launch
    (torch's agent raises its SignalException then)."""

    def __init__(self, message: str, exit_code: int, sigval: int):
        super().__init__(message, exit_code)
        self.sigval = sigval

    def __reduce__(self):
        return type(self), (str(self), self.exit_code, self.sigval)


class ChildFailedError(LaunchError):
    """Workers failed (after any restarts): `failures` maps global ranks to what happened,
    `get_first_failure()` gives the root cause, `format_msg()` the report dist-launch printed."""

    def __init__(self, name: str, failures: Dict[int, ProcessFailure], root_rank: int,
                 report: str, exit_code: int):
        self.name = name
        self.failures = failures
        self.root_rank = root_rank
        self.report = report
        root = failures[root_rank]
        summary = (f"{name} failed: rank {root_rank} (local rank {root.local_rank} on "
                   f"{root.host}) exited with {root.exitcode}")
        if root.exitcode < 0:
            summary += f" ({root.signal_name()})"
        if root.message:
            summary += f": {root.message}"
        super().__init__(summary, exit_code)

    def __reduce__(self):
        return type(self), (self.name, self.failures, self.root_rank, self.report,
                            self.exit_code)

    def get_first_failure(self) -> Tuple[int, ProcessFailure]:
        return self.root_rank, self.failures[self.root_rank]

    def format_msg(self) -> str:
        return self.report

    @classmethod
    def of(cls, name: str, failures: Dict[int, ProcessFailure], root_rank: int, report: str,
           exit_code: int) -> "ChildFailedError":
        """The error to raise: where the caller has torch's ChildFailedError loaded (its code
        names it in an `except`), one of those too, so that code written for torch's
        elastic_launch catches it unchanged."""
        errors = sys.modules.get("torch.distributed.elastic.multiprocessing.errors")
        torchs = getattr(errors, "ChildFailedError", None)
        if not isinstance(torchs, type) or not issubclass(torchs, BaseException):
            return cls(name, failures, root_rank, report, exit_code)
        kin = _TORCH_KIN.get(torchs)
        if kin is None:
            kin = type("ChildFailedError", (cls, torchs), {
                "__module__": cls.__module__,
                "__doc__": cls.__doc__,
                # (made again where it lands: torch's too if that process has torch's loaded)
                "__reduce__": lambda self: (ChildFailedError.of, (self.name, self.failures,
                                                                  self.root_rank, self.report,
                                                                  self.exit_code)),
                "get_first_failure": _first_failure_for_torchs_record,
            })
            _TORCH_KIN[torchs] = kin
        return kin(name, failures, root_rank, report, exit_code)


_TORCH_KIN: Dict[type, type] = {}


def _first_failure_for_torchs_record(self) -> Tuple[int, ProcessFailure]:
    """The root cause, as torch's @record takes it from a ChildFailedError it catches: it copies
    the failure's error file into its own unless the file is "<N/A>", so an error file it could
    not read (none: "", another host's worker's, one cut short as its worker was killed) is
    "<N/A>" here, not a read that fails and hides the failure. (This class's only: dist_launch's
    own ChildFailedError keeps the file as the report names it.)"""
    rank, failure = ChildFailedError.get_first_failure(self)
    data = failure.error_file_data  # ({} when it is none, gone or not JSON)
    if not isinstance(data, dict) or not data:
        failure = dataclasses.replace(failure, error_file="<N/A>")
    return rank, failure


RULE = "=" * 60
THIN_RULE = "-" * 60
_ENTRY = re.compile(r"^\[(\d+)\]:$")
_FIELD = re.compile(r"^  (time|host|rank|exitcode|error_file|message|traceback) *: ?(.*)$")
_CONTINUATION = " " * 14  # a traceback's further lines


@dataclass
class FailureReport:
    """dist-launch's failure report, parsed: every failure and which one is the root cause."""

    name: str
    failures: List[ProcessFailure] = field(default_factory=list)
    root: Optional[ProcessFailure] = None
    text: str = ""


_CUT = re.compile(r"\.\.\. \((\d+) bytes: whole in the traceback\)$")


def _whole_message(message: str, traceback: str) -> str:
    """A message the report cut (failure_report.cc: message_shown), whole again from the
    traceback, which has it."""
    cut = _CUT.search(message)
    if not cut:
        return message
    shown, size = message[: cut.start()].encode(), int(cut.group(1))
    whole = traceback.encode()
    at = whole.rfind(shown)
    if at < 0:
        return message
    return whole[at: at + size].decode(errors="replace")


def _failure(fields: Dict[str, str]) -> ProcessFailure:
    rank = re.match(r"(-?\d+) \(local_rank: (-?\d+)\)", fields.get("rank", ""))
    code = re.match(r"(-?\d+)(?: \(\w+\))? \(pid: (-?\d+)\)", fields.get("exitcode", ""))
    if not rank or not code:
        raise ValueError(f"malformed failure entry in dist-launch's report: {fields}")
    try:
        timestamp = int(time.mktime(time.strptime(fields.get("time", ""), "%Y-%m-%d_%H:%M:%S")))
    except ValueError:
        timestamp = 0
    error_file = fields.get("error_file", "")
    return ProcessFailure(rank=int(rank.group(1)), local_rank=int(rank.group(2)),
                          host=fields.get("host", ""), pid=int(code.group(2)),
                          exitcode=int(code.group(1)),
                          error_file="" if error_file == "<N/A>" else error_file,
                          message=_whole_message(fields.get("message", ""),
                                                 fields.get("traceback", "")),
                          traceback=fields.get("traceback", ""), timestamp=timestamp)


def parse_report(lines: List[str]) -> FailureReport:
    """Parses the report's lines, from its first rule to its last (as format_report writes them:
    agent/src/workers/failure_report.cc)."""
    if len(lines) < 2 or lines[0] != RULE or not lines[1].endswith(" FAILED"):
        raise ValueError("not a dist-launch failure report")
    report = FailureReport(name=lines[1][: -len(" FAILED")], text="\n".join(lines) + "\n")
    entries: List[Tuple[bool, Dict[str, str]]] = []  # (is the root cause, fields)
    in_root = False
    key = None
    for line in lines[2:]:
        if line.startswith("Root Cause"):
            in_root = True
        elif _ENTRY.match(line):
            entries.append((in_root, {}))
            key = None
        elif entries and (m := _FIELD.match(line)):
            key = m.group(1)
            entries[-1][1][key] = m.group(2)
        elif entries and key and line not in (RULE, THIN_RULE):
            # A traceback's indented lines, or a message that spans lines.
            text = line[len(_CONTINUATION):] if line.startswith(_CONTINUATION) else line
            entries[-1][1][key] += "\n" + text
    for is_root, fields in entries:
        failure = _failure(fields)
        report.failures.append(failure)
        if is_root:
            report.root = failure
    if report.root is None:
        raise ValueError("dist-launch's failure report names no root cause")
    return report
