"""Launching a training script from Python, the way torchx's local scheduler, Lightning's
`fabric run` or accelerate drive torchrun through torch.distributed.launcher.api: a LaunchConfig
built from the caller's own options, `elastic_launch(config, script)(*args)`, results by global rank,
and on failure the root cause from the exception rather than from scraping the console.

    python examples/python/launch.py -j 1x2 --max-restarts 1 examples/torch/ddp_train.py --steps 5
    python examples/python/launch.py -j 2x4 --rdzv-endpoint HOST:29400 --job-id job7 train.py

-j NNODESxNPROC, as torchx's dist.ddp takes it (NNODES may be MIN:MAX). Needs `pip install .` (the
dist_launch package); no torch here: torch belongs to the script.
"""
import argparse
import sys

from dist_launch import ChildFailedError, LaunchConfig, elastic_launch


def config_from(args: argparse.Namespace) -> LaunchConfig:
    nnodes, nproc = args.j.split("x")
    min_nodes, _, max_nodes = nnodes.partition(":")
    return LaunchConfig(
        min_nodes=int(min_nodes),
        max_nodes=int(max_nodes or min_nodes),
        nproc_per_node=int(nproc) if nproc.isdigit() else nproc,  # or gpu, auto
        run_id=args.job_id,
        rdzv_backend="c10d" if args.rdzv_endpoint else "static",
        rdzv_endpoint=args.rdzv_endpoint,
        max_restarts=args.max_restarts,
        log_dir=args.log_dir,
        tee=3 if args.log_dir else 0,  # with a log directory: files and console
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-j", default="1x1", help="NNODESxNPROC_PER_NODE, e.g. 1x2 or 1:4x8")
    ap.add_argument("--rdzv-endpoint", default="", help="HOST:PORT of an elastic job's store")
    ap.add_argument("--job-id", default="", help="shared by every node of the job")
    ap.add_argument("--max-restarts", type=int, default=0)
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("script")
    ap.add_argument("script_args", nargs=argparse.REMAINDER)
    args = ap.parse_args()

    try:
        results = elastic_launch(config_from(args), args.script)(*args.script_args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        why = failure.message or (f"signal {failure.signal_name()}" if failure.exitcode < 0
                                  else f"exit code {failure.exitcode}")
        print(f"launch.py: {e.name} failed on rank {rank} ({failure.host}): {why}",
              file=sys.stderr)
        return e.exit_code
    print(f"launch.py: every worker of this node succeeded: exit codes by rank {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
