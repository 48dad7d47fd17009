"""Runs a torch script under dist-launch with the progress hook on but its sampler stopped (the
optimizer step hook alone): bench/hang_bench.py's overhead, split into its parts.

    PYTHON_EXEC=python3 build/bin/dist-launch --nproc-per-node 2 bench/hook_without_sampler.py \\
        tests/torch/hang_worker.py --work 0.003 --steps 1500
"""
import runpy
import sys

import torch  # noqa: F401  (the agent's hook starts its sampler as torch is imported)

try:
    import _dist_launch_progress as progress  # the hook dist-launch puts on the workers' path
except ImportError:
    sys.exit("run this under dist-launch (its hook is on the workers' path there)")
progress._sampler = None  # its thread leaves at its next pass; the step hook stays
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
