"""dist-launch under a real Slurm 22.05 (slurm_cluster.py: munged, slurmctld and three slurmd on
127.0.0.1-3 of this machine): srun steps give the workers the right ranks and a master inside the
step, two steps of one job run at once, extra tasks per node leave, a batch script without srun is an
error at once, scancel leaves no process behind, and slurmstepd's signals are recognised as such.

    python3 slurm_test.py --launcher build/bin/dist-launch --worker build/bin/dist-test-worker \
        --probe build/bin/dist-signal-probe
Exits 77 (skip) when Slurm cannot run here (not root, or not installed).
"""
import argparse
import functools
import os
import re
import secrets
import shlex
import shutil
import signal
import sys
import tempfile
import time
import unittest

import slurm_cluster
from slurm_cluster import SlurmCluster, wait_until

SKIP = 77
STEP_TIMEOUT_S = 90  # a whole srun/salloc/sbatch command
FILES_TIMEOUT_S = 60  # workers' files appearing
GONE_TIMEOUT_S = 10  # processes gone once Slurm says the job ended
SUSPENDED_S = 8  # a job held by `scontrol suspend`
RDZV_TIMEOUT = "timeout=60"
ARGS = None
CLUSTER = None


def setUpModule():
    global CLUSTER
    CLUSTER = SlurmCluster()


def tearDownModule():
    CLUSTER.stop()


def read_env(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def stat_fields(pid):
    """/proc/<pid>/stat's fields after the command's name: the state letter (R, S, T, Z, ...),
    the parent's pid, ...; [] once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return []


def process_state(pid):
    return (stat_fields(pid) or [""])[0]


def processes_with(marker):
    """Live processes whose environment holds `marker` (zombies have none to read)."""
    found = []
    needle = marker.encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read():
                    with open(f"/proc/{pid}/cmdline", "rb") as c:
                        command = c.read().replace(b"\0", b" ").decode(errors="replace")
                    found.append(f"{pid}: {command}")
        except OSError:
            pass
    return found


class Job:
    """A directory for one test's scripts and the files its workers write."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="dist-slurm-job-")
        os.chmod(self.dir, 0o755)

    def path(self, name):
        return os.path.join(self.dir, name)

    def script(self, name, body):
        path = self.path(name)
        with open(path, "w") as f:
            f.write("#!/bin/bash\n" + body + "\n")
        os.chmod(path, 0o755)
        return path

    def launch(self, *args):
        """The dist-launch command line for a script, the worker's arguments last."""
        return " ".join([shlex.quote(ARGS.launcher), *args])

    def worker(self, *actions):
        return " ".join(["--no-python", shlex.quote(ARGS.worker), *actions])

    def envs(self, pattern):
        return {name: read_env(self.path(name))
                for name in sorted(os.listdir(self.dir)) if re.fullmatch(pattern, name)}

    def remove(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class DistLaunchUnderSlurm(unittest.TestCase):
    def setUp(self):
        self.job = Job()
        self.addCleanup(self.job.remove)

    def run_slurm(self, argv, **kwargs):
        proc = CLUSTER.run(argv, STEP_TIMEOUT_S, cwd=self.job.dir, **kwargs)
        return proc, proc.stdout + proc.stderr

    def test_srun_on_two_nodes(self):
        step = self.job.script("step.sh", "exec " + self.job.launch(
            "--nproc-per-node", "2", "--rdzv-conf", RDZV_TIMEOUT,
            self.job.worker("env", self.job.path("env_${SLURM_NODEID}_'${local_rank}'"))))
        proc, out = self.run_slurm(["srun", "-N2", step])
        self.assertEqual(proc.returncode, 0, out)
        envs = self.job.envs(r"env_\d_\d")
        self.assertEqual(len(envs), 4, out)
        self.assertEqual(sorted(e["RANK"] for e in envs.values()), ["0", "1", "2", "3"])
        for name, e in envs.items():
            with self.subTest(name):
                self.assertEqual(e["WORLD_SIZE"], "4")
                self.assertEqual(e["GROUP_RANK"], e["SLURM_NODEID"])
                self.assertEqual(e["MASTER_ADDR"], "127.0.0.1")
                self.assertEqual(e["TORCHELASTIC_RUN_ID"],
                                 f"slurm-{e['SLURM_JOB_ID']}.{e['SLURM_STEP_ID']}")
        self.assertEqual(len({e["MASTER_PORT"] for e in envs.values()}), 1)

    def test_a_step_on_the_last_two_nodes_of_three(self):
        # Rank 1 fails once rank 0 has written its environment: the job's report names its node.
        worker = self.job.script("worker.sh", f"""
env > {self.job.dir}/env_$SLURM_NODEID
[ "$RANK" = 1 ] || exit 0
for _ in $(seq {FILES_TIMEOUT_S * 10}); do
  [ -s {self.job.dir}/env_0 ] && exit 3
  sleep 0.1
done
exit 1""")
        step = self.job.script("step.sh", "exec " + self.job.launch(
            "--rdzv-conf", RDZV_TIMEOUT, "--no-python", worker))
        proc, out = self.run_slurm(["salloc", "-N3", "srun", "-N2", "-r1", step])
        self.assertEqual(proc.returncode, 3, out)
        envs = self.job.envs(r"env_\d")
        self.assertEqual(len(envs), 2, out)
        for e in envs.values():
            self.assertEqual(e["MASTER_ADDR"], "127.0.0.2", "the step's first node")
            self.assertEqual(e["WORLD_SIZE"], "2")
        self.assertEqual(envs["env_1"]["SLURMD_NODENAME"], "127.0.0.3")
        # Each node reports under its own Slurm node name, not the machine's host name.
        self.assertIn("host      : 127.0.0.3 (node 1)", out)

    def test_two_multi_node_steps_of_one_job_at_once(self):
        # Each worker writes its environment, then waits for all four: the steps overlap.
        waiter = self.job.script("wait_for_all.sh", f"""
env > {self.job.dir}/env_${{SLURM_STEP_ID}}_${{RANK}}
for _ in $(seq {FILES_TIMEOUT_S * 10}); do
  [ "$(ls {self.job.dir} | grep -c '^env_')" -ge 4 ] && exit 0
  sleep 0.1
done
exit 1""")
        step = self.job.launch("--rdzv-conf", RDZV_TIMEOUT, "--no-python", waiter)
        both = self.job.script("both.sh", f"""
srun --overlap -N2 -n2 {step} & first=$!
srun --overlap -N2 -n2 {step} & second=$!
wait $first; a=$?; wait $second; b=$?
exit $((a | b))""")
        proc, out = self.run_slurm(["salloc", "-N2", "--ntasks-per-node=2", both])
        self.assertEqual(proc.returncode, 0, out)
        envs = self.job.envs(r"env_\d+_\d")
        self.assertEqual(len(envs), 4, out)
        steps = {}
        for e in envs.values():
            steps.setdefault(e["SLURM_STEP_ID"], []).append(e)
        self.assertEqual(len(steps), 2, out)
        for step_envs in steps.values():
            self.assertEqual(sorted(e["RANK"] for e in step_envs), ["0", "1"])
            self.assertEqual(len({e["MASTER_PORT"] for e in step_envs}), 1)
        ports = {step_envs[0]["MASTER_PORT"] for step_envs in steps.values()}
        run_ids = {step_envs[0]["TORCHELASTIC_RUN_ID"] for step_envs in steps.values()}
        self.assertEqual(len(ports), 2, "the two steps share a store port")
        self.assertEqual(len(run_ids), 2, "the two steps share a run id")

    def test_two_tasks_per_node_run_one_agent_per_node(self):
        step = self.job.script("step.sh", "exec " + self.job.launch(
            "--nproc-per-node", "1", "--rdzv-conf", RDZV_TIMEOUT,
            self.job.worker("env", self.job.path("env_${SLURM_NODEID}_${SLURM_LOCALID}"))))
        proc, out = self.run_slurm(["salloc", "-N2", "--ntasks-per-node=2",
                                    "srun", "-N2", "--ntasks-per-node=2", step])
        self.assertEqual(proc.returncode, 0, out)
        envs = self.job.envs(r"env_\d_\d")
        self.assertEqual(sorted(envs), ["env_0_0", "env_1_0"], out)
        for e in envs.values():
            self.assertEqual(e["WORLD_SIZE"], "2")
        self.assertIn("Slurm task 1 of node 127.0.0.1 exits", out)
        self.assertIn("Slurm task 1 of node 127.0.0.2 exits", out)

    def test_a_multi_node_batch_script_without_srun_fails_at_once(self):
        command = self.job.launch("--nproc-per-node", "1", self.job.worker("exit", "0"))
        proc, out = self.run_slurm(["sbatch", "-N2", "--wait", "-o", self.job.path("batch.out"),
                                    "--wrap", command])
        with open(self.job.path("batch.out")) as f:
            batch = f.read()
        self.assertEqual(proc.returncode, 2, out + batch)
        self.assertIn("no SLURM_STEP_ID", batch)
        self.assertIn("srun --ntasks-per-node=1 dist-launch", batch)

    def test_scancel_leaves_no_process_behind(self):
        outcome = scancel_outcome()
        self.assertEqual(outcome["left"], [], "processes of the cancelled job still run")
        self.assertEqual(outcome["workers"], 4, outcome["log"])

    def test_scancel_signals_each_worker_once(self):
        # Pending the agent: slurmstepd signals every process of the step; the agent must not
        # forward that SIGTERM again (dist::agent::sent_by_slurm_step tells it).
        outcome = scancel_outcome()
        self.assertEqual(outcome["senders"], [["slurmstepd"]] * 4, outcome["log"])

    def test_signals_from_slurmstepd_are_recognised(self):
        job = self.job
        probe = job.script("probe.sh", f"exec {shlex.quote(ARGS.probe)} once "
                           f"{job.dir}/ready_$SLURM_PROCID {job.dir}/result_$SLURM_PROCID")
        proc, out = self.run_slurm(["sbatch", "-N1", "-n2", "--parsable", "-o",
                                    job.path("probe.out"), "--wrap", f"srun {probe}"])
        self.assertEqual(proc.returncode, 0, out)
        job_id = proc.stdout.strip().split(";")[0]
        ready = [job.path("ready_0"), job.path("ready_1")]
        wait_until(lambda: all(os.path.exists(p) and os.path.getsize(p) > 0 for p in ready),
                   FILES_TIMEOUT_S, "both probes start")
        with open(ready[1]) as f:
            os.kill(int(f.read()), signal.SIGTERM)  # from this test: not Slurm
        wait_until(lambda: os.path.exists(job.path("result_1")), FILES_TIMEOUT_S, "probe 1 ends")
        CLUSTER.run(["scancel", job_id], STEP_TIMEOUT_S)
        CLUSTER.wait_job_done(job_id, STEP_TIMEOUT_S)
        with open(job.path("result_0")) as f:
            self.assertEqual(f.read().strip(), "sent_by_slurm_step=1 sender=slurmstepd")
        with open(job.path("result_1")) as f:
            self.assertRegex(f.read().strip(), r"^sent_by_slurm_step=0 sender=python")

    def test_a_suspended_and_resumed_job_runs_on(self):
        # `scontrol suspend` holds every process of the job (SIGSTOP: the agents and their
        # workers) and `scontrol resume` continues them: the agents' own stall is not the workers'
        # silence. Each agent used to look at its ranks as silent for the whole suspension (the
        # stacks asked for; with an agent continued before its workers, a kill:
        # Watchdogs.AJobSuspendedAndResumedWithItsAgentIsNotTakenForHung).
        job = self.job
        step = job.script("step.sh", "exec " + job.launch(
            "--nproc-per-node", "1", "--worker-heartbeat-timeout", "3", "--hang-timeout", "3",
            "--rdzv-conf", RDZV_TIMEOUT,
            job.worker("progress", "50", "sleep", "300", "pidfile",
                       job.path("pid_${SLURM_NODEID}"), "wait-file", job.path("go"))))
        proc, out = self.run_slurm(["sbatch", "-N2", "--parsable", "-o", job.path("job.out"),
                                    "--wrap", f"srun {step}"])
        self.assertEqual(proc.returncode, 0, out)
        job_id = proc.stdout.strip().split(";")[0]
        pids = [job.path("pid_0"), job.path("pid_1")]
        wait_until(lambda: all(os.path.exists(p) and os.path.getsize(p) > 0 for p in pids),
                   FILES_TIMEOUT_S, "both workers run")
        agents = []
        for p in pids:
            with open(p) as f:
                agents.append(int(stat_fields(int(f.read()))[1]))
        self.assertEqual(CLUSTER.run(["scontrol", "suspend", job_id], 30).returncode, 0)
        wait_until(lambda: CLUSTER.job_state(job_id) == "SUSPENDED", 30, "the job is suspended")
        # Slurm says SUSPENDED before its slurmd has stopped the processes (seconds later on a
        # loaded machine, which once made the agents' stall shorter than they notice): the
        # suspension is timed from when both agents are stopped.
        wait_until(lambda: all(process_state(a) == "T" for a in agents), 30,
                   "both agents are stopped")
        time.sleep(SUSPENDED_S)  # the suspension itself: longer than every timeout above
        self.assertEqual(CLUSTER.run(["scontrol", "resume", job_id], 30).returncode, 0)
        with open(job.path("go"), "w") as f:
            f.write("go\n")
        CLUSTER.wait_job_done(job_id, STEP_TIMEOUT_S)
        with open(job.path("job.out")) as f:
            log = f.read()
        self.assertEqual(CLUSTER.job_state(job_id), "COMPLETED", log)
        self.assertIn("the agent did not run for", log)
        for harm in ("no heartbeat", "hang on ", "looking at where every rank is"):
            self.assertNotIn(harm, log)


@functools.lru_cache(maxsize=None)
def scancel_outcome():
    """A two-node job of four workers that record every SIGTERM's sender and keep running,
    cancelled: what is left of it, and who signalled each worker."""
    job = Job()
    try:
        marker = f"DIST_SLURM_TEST_MARKER={secrets.token_hex(8)}"
        step = job.script("step.sh", "exec " + job.launch(
            "--nproc-per-node", "2", "--shutdown-timeout", "2", "--rdzv-conf", RDZV_TIMEOUT,
            "--no-python", shlex.quote(ARGS.probe), "count",
            job.path("pid_${SLURM_NODEID}_'${local_rank}'"),
            job.path("sig_${SLURM_NODEID}_'${local_rank}'")))
        env = CLUSTER.env(**dict([marker.split("=", 1)]))
        submitted = CLUSTER.run(["sbatch", "-N2", "--parsable", "-o", job.path("job.out"),
                                 "--wrap", f"srun {step}"], STEP_TIMEOUT_S, env=env, cwd=job.dir)
        job_id = submitted.stdout.strip().split(";")[0]
        workers = [f"{n}_{r}" for n in (0, 1) for r in (0, 1)]
        try:
            wait_until(lambda: all(os.path.exists(job.path(f"pid_{w}")) for w in workers),
                       FILES_TIMEOUT_S, "4 workers run")
        except TimeoutError:
            pass  # reported through the worker count below
        running = sum(os.path.exists(job.path(f"pid_{w}")) for w in workers)
        CLUSTER.run(["scancel", job_id], STEP_TIMEOUT_S)
        CLUSTER.wait_job_done(job_id, STEP_TIMEOUT_S)
        try:
            wait_until(lambda: not processes_with(marker), GONE_TIMEOUT_S, "the job's processes go")
        except TimeoutError:
            pass
        left = processes_with(marker)
        for entry in left:  # never leave them running for the next test
            os.kill(int(entry.split(":")[0]), signal.SIGKILL)
        senders = []
        for w in workers:
            try:
                with open(job.path(f"sig_{w}")) as f:
                    senders.append(f.read().split())
            except OSError:
                senders.append([])
        with open(job.path("job.out")) as f:
            log = f.read()
        return {"left": left, "workers": running, "senders": senders, "log": log}
    finally:
        job.remove()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--worker", required=True)
    parser.add_argument("--probe", required=True)
    ARGS, rest = parser.parse_known_args()
    for name in ("launcher", "worker", "probe"):
        setattr(ARGS, name, os.path.abspath(getattr(ARGS, name)))
    why = slurm_cluster.unavailable()
    if why:
        print(f"skipping: {why}", file=sys.stderr)
        sys.exit(SKIP)
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
