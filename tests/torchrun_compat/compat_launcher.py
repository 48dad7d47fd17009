"""The launcher under test, where PyTorch's launcher tests call torchrun in their own process
(`launch.main(args)`): the same arguments, the launcher run as a subprocess.

The launcher is DIST_TORCHRUN_COMPAT_LAUNCHER: a path to an executable (dist-launch), or "torchrun"
for torch.distributed.run in this interpreter, so that both go through the same harness. Its
output is passed on to sys.stdout and sys.stderr (a test's redirect_stdout sees it), and its
outcome becomes what launch.main would have done:
  - exit 0: return;
  - a worker failed (the failure report's "Root Cause (first observed failure)" is on stderr, as
    torchrun and dist-launch print it): ChildFailedError;
  - any other failure (the launcher refused the configuration): ValueError, as torchrun raises for
    a configuration it cannot run.
Workers use this interpreter (PYTHON_EXEC, unless set already), as torchrun's use its own.
"""
import os
import subprocess
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

LAUNCH_TIMEOUT_S = 300  # one launch; the slowest upstream test starts 4 torch workers twice
ROOT_CAUSE = "Root Cause (first observed failure)"


def launcher_command():
    launcher = os.environ.get("DIST_TORCHRUN_COMPAT_LAUNCHER", "torchrun")
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run"]
    return [launcher]


def launch_cli(args):
    env = dict(os.environ)
    env.setdefault("PYTHON_EXEC", sys.executable)
    proc = subprocess.run(launcher_command() + [str(a) for a in args], env=env,
                          capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S)
    sys.stdout.write(proc.stdout)
    sys.stderr.write(proc.stderr)
    if proc.returncode == 0:
        return
    if ROOT_CAUSE in proc.stderr:
        failure = ProcessFailure(local_rank=0, pid=-1, exitcode=proc.returncode, error_file="")
        raise ChildFailedError(name=" ".join(launcher_command()), failures={0: failure})
    last_line = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    raise ValueError(f"the launcher exited with {proc.returncode}: {last_line}")
