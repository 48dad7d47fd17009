"""Healthy torch jobs under dist-launch's defaults (tests/torch/healthy_worker.py): each ends as
under torchrun, exit 0, with no worker killed, no hang acted upon and no straggler flagged. A
rank that works on its own for longer than the automatic hang timeout's floor (30 s) while the
others wait (it sleeps, writes checkpoints, evaluates, logs to a slow service; a pause between two
steps; a stall of every rank; a long first step; a DataLoader's workers; no optimizer at all;
gradient accumulation; the script's own collective timeout) may be reported, never ended; one
that says its pause (dist_launch.progress.pause) is reported as paused, never as a hang; and
torch.compile(fullgraph=True) of a function with a collective, torch's functional collectives and
DTensor work as they do without dist-launch (torch 2.x); a worker whose interpreter ends
while dist-launch's progress sampler reads its group exits 0; waits that look like collectives
that can never match are left alone where a thread of the script's own issues what a peer waits
for, or where a send shifted two ranks' counts while a third rank works; and a rank evaluating
alone after the job, longer than the other node's exit barrier waits, ends the job with 0 on both
nodes.

The scenarios run side by side, a few jobs at a time (a loaded machine is their normal case).

    python3 healthy_test.py --launcher build/bin/dist-launch --python python3 [--require-major 2]
    (HEALTHY_SCENARIOS=c-poll,slow-log runs those scenarios' jobs alone)
Exits 77 (skip) when that interpreter has no torch (or not --require-major).
"""
import concurrent.futures
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import launcher_test_main

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "healthy_worker.py")
ARGS = None
PAUSE_S = 36  # past the automatic hang timeout's 30 s floor, and its look
JOB_TIMEOUT_S = 400  # a job's; past it, that scenario fails (the test's own is 900 s)
CONCURRENT_JOBS = 6  # most of each job is a pause: six take about one of two cores

SCENARIOS = ["sleep", "save", "eval", "between", "all", "timeout", "first-step", "loader",
             "no-optimizer", "accumulate", "slow-log", "c-poll", "paused", "compile", "exit",
             "crowded",
             "alone", "monitored", "scoring", "objects", "side-thread", "producer", "p2p-offset",
             "join", "skewed", "end-wait", "async-save"]
# Past the job's own collective timeout (10 s) and the agent's margin (60 s) after it; monitored
# and scoring: past the third look of the hang timeout (about 99 s), the first past that bound.
# skewed: past the hang timeout's look (about 32 s), so that the ranks are looked at.
PAUSES = {"alone": 80, "monitored": 105, "scoring": 105, "skewed": 45}


class SlowService:
    """A log service that reads slowly: 96 KiB a second, so that a sender's socket fills and
    its sends block for most of PAUSE_S."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self):
        try:
            conn, _ = self.server.accept()
        except OSError:
            return
        with conn:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            while conn.recv(9600):
                time.sleep(0.1)

    def close(self):
        self.server.close()


class Job:
    def __init__(self, scenario, directory):
        self.scenario = scenario
        self.dir = os.path.join(directory, scenario)
        os.makedirs(self.dir)
        self.events_path = os.path.join(self.dir, "events.jsonl")

    def run(self):
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
        extra = []
        service = None
        if self.scenario == "slow-log":
            service = SlowService()
            extra = ["--log-port", str(service.port)]
        nproc, on_cpus = 2, None
        if self.scenario == "crowded":  # 4 ranks on one CPU, whatever the machine
            nproc, on_cpus = 4, {min(os.sched_getaffinity(0))}
        if self.scenario in ("p2p-offset", "skewed"):
            nproc = 3
        logs = ["--log-dir", os.path.join(self.dir, "logs")]
        if self.scenario == "end-wait":  # the temporary run directory, made here
            logs, env["TMPDIR"] = [], self.dir
        cmd = [ARGS.launcher, "--nproc-per-node", str(nproc), "--event-log", self.events_path,
               *logs, WORKER, "--scenario", self.scenario,
               "--pause", str(PAUSES.get(self.scenario, PAUSE_S)), *extra]
        start = time.monotonic()
        try:
            self.proc = subprocess.run(
                launcher_test_main.on_cpus(on_cpus, cmd) if on_cpus else cmd, env=env,
                capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:  # this scenario fails, saying so; the others stand
            said = [b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
                    for b in (e.stdout, e.stderr)]
            said[1] += f"\n[healthy_test] the job did not end within {JOB_TIMEOUT_S} s: killed"
            self.proc = subprocess.CompletedProcess(cmd, -9, *said)
        finally:
            if service:
                service.close()
        self.seconds = time.monotonic() - start
        return self

    def events(self, name):
        if not os.path.exists(self.events_path):
            return []
        with open(self.events_path) as f:
            return [e for e in map(json.loads, f) if e["event"] == name]


class ExitBarrier(unittest.TestCase):
    """Two nodes (not in Healthy's pool of one-node jobs)."""

    def test_a_rank_evaluating_alone_after_the_job_past_the_other_nodes_exit_barrier(self):
        # Two nodes, a rank each. Node 1's rank finishes; node 0's rank 0 then evaluates alone
        # past --exit-barrier-timeout (3 s), until node 1 has left (8 s at least: under load the
        # other rank's exit alone took most of a fixed 8 s): node 1 leaves with 0, as torchrun's
        # agent does, and node 0's job goes on to its end, 0. Node 1 used to exit 1 there, and
        # node 0 took it for lost and restarted the finished job.
        port = launcher_test_main.free_port("127.0.0.2")
        work = tempfile.mkdtemp(prefix="dist-healthy-barrier-")
        left = os.path.join(work, "node-1-left")
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
        procs, files = [], []
        try:
            for node in (0, 1):
                cmd = [ARGS.launcher, "--nnodes", "2", "--node-rank", str(node), "--master-addr",
                       "127.0.0.2", "--master-port", str(port), "--nproc-per-node", "1",
                       "--exit-barrier-timeout", "3", WORKER, "--scenario", "final-eval",
                       "--pause", "8", "--until-file", left]
                # Into files: node 0 runs on unread while the test waits for node 1.
                files.append([open(os.path.join(work, f"{node}.{s}"), "w+") for s in "oe"])
                procs.append(subprocess.Popen(cmd, env=env, stdout=files[node][0],
                                              stderr=files[node][1], text=True))
                if node == 0:
                    launcher_test_main.wait_for_listener("127.0.0.2", port, procs[0])
            procs[1].wait(timeout=180)
            open(left, "w").close()
            procs[0].wait(timeout=180)
            outs = []
            for pair in files:
                outs.append([])
                for f in pair:
                    f.seek(0)
                    outs[-1].append(f.read())
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for f in sum(files, []):
                f.close()
            shutil.rmtree(work, ignore_errors=True)
        both = "\n".join(o + e for o, e in outs)
        for p in procs:
            self.assertEqual(p.returncode, 0, both)
        self.assertIn("not every node finished within 3 s", outs[1][1], both)
        self.assertIn("rank 0 evaluated after the job", outs[0][0], both)
        for out, err in outs:
            self.assertNotIn("restarting the worker group", err, both)
            self.assertNotIn("lost", err, both)
        self.assertEqual(len(re.findall(r"rank \d done steps", both)), 2, both)


class Healthy(unittest.TestCase):
    jobs = {}

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="dist-healthy-test-")
        major = int(ARGS.version.split(".")[0])
        scenarios = [s for s in SCENARIOS if s not in ("compile", "async-save") or major >= 2]
        only = os.environ.get("HEALTHY_SCENARIOS")  # a few, while working on them: "c-poll,sleep"
        if only:
            scenarios = [s for s in scenarios if s in only.split(",")]
        # The longest first (their pauses; torch.compile's compiling), so that the pool's last
        # jobs are short ones.
        scenarios.sort(key=lambda s: -PAUSES.get(s, 90 if s == "compile" else PAUSE_S))
        with concurrent.futures.ThreadPoolExecutor(CONCURRENT_JOBS) as pool:
            for job in pool.map(lambda s: Job(s, cls.dir).run(), scenarios):
                cls.jobs[job.scenario] = job
        print("jobs' seconds: " + ", ".join(f"{s} {cls.jobs[s].seconds:.0f}" for s in scenarios),
              file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def check(self, scenario):
        if scenario not in self.jobs:
            self.skipTest(f"{scenario} not run (it needs torch 2.x, or HEALTHY_SCENARIOS left it out)")
        job = self.jobs[scenario]
        out = job.proc.stdout + job.proc.stderr
        self.assertEqual(job.proc.returncode, 0, out)
        for rank in (0, 1):
            self.assertRegex(job.proc.stdout, rf"rank {rank} done steps \d+ hook \d+", out)
        self.assertEqual(job.events("hang"), [], out)
        self.assertEqual([e for e in job.events("worker_exit") if e["reason"]], [], out)
        self.assertEqual([e for e in job.events("straggler") if e["straggler"]], [], out)
        self.assertNotIn("SIGKILL", job.proc.stderr)
        self.assertNotIn("restarting the worker group", job.proc.stderr)
        return job

    def test_a_worker_ends_while_the_sampler_is_in_torchs_code(self):
        # The interpreter's exit waits for the sampler's pass under way: without that, a pass
        # inside torch's C++ then aborts the worker (SIGABRT, "terminate called without an
        # active exception") after the script succeeded.
        job = self.check("exit")
        for rank in (0, 1):
            self.assertIn(f"rank {rank} exits with the sampler reading", job.proc.stdout)
        self.assertNotIn("terminate called", job.proc.stdout + job.proc.stderr)

    def test_more_ranks_than_cpus_flag_no_straggler(self):
        # 4 ranks of one model on one CPU: each waits for it most of the time it could run, and
        # the scheduler makes a different rank the slowest from one second to the next. Their
        # work per step told a straggler in a third of the runs of this before (and in 3 runs of
        # 5 at 8 ranks on 2 CPUs); now no rank is taken for one while they wait for CPUs, and
        # the agent says why.
        job = self.check("crowded")
        self.assertRegex(job.proc.stderr, r"the workers here wait for a CPU \d+% of the time",
                         job.proc.stderr)

    def test_a_rank_sleeping_while_the_other_waits_in_a_barrier(self):
        job = self.check("sleep")
        # Seen, and said: the rank, its line, and that it does nothing; not ended.
        (suspected,) = job.events("hang_suspected")
        (rank0,) = [r for r in suspected["ranks"] if r["rank"] == 0]
        self.assertTrue(rank0["suspect"])
        self.assertRegex(rank0["where"], r"healthy_worker\.py:\d+ in main")
        self.assertTrue(rank0["doing"].startswith("idle"), rank0)
        (cleared,) = job.events("hang_cleared")
        self.assertFalse(cleared["ended"], "its steps, after the pause, cleared it")
        self.assertRegex(job.proc.stderr, r"or past the job's collective timeout, 1800 s and a "
                         r"margin of 60 s: 1860 s\)")  # torch's default timeout, the agent's margin

    def test_a_rank_idle_after_the_last_step_then_every_rank_exits(self):
        # Rank 0 waits for something of its own after the last step (a remote evaluation) while
        # rank 1 waits in a barrier, then both exit 0 with no step after it: the suspicion is
        # over, and said so (it stood open in the event log and on the status page for good).
        job = self.check("end-wait")
        self.assertGreaterEqual(len(job.events("hang_suspected")), 1, job.proc.stderr)
        (cleared,) = job.events("hang_cleared")
        self.assertTrue(cleared["ended"], cleared)
        self.assertIn("the suspected hang is over: every rank here made progress or exited "
                      "with 0", job.proc.stderr)
        # The stacks its warning named are kept (the temporary run directory was removed).
        named = re.search(r"stacks: (\S+)/\*/stacks\.txt", job.proc.stderr)
        self.assertTrue(named, job.proc.stderr)
        self.assertTrue(os.listdir(named.group(1)), named.group(1))
        self.assertIn("kept in " + job.dir, job.proc.stderr)
        self.assertIn("(the stacks a hang report named)", job.proc.stderr)

    def test_an_async_checkpoint_to_slow_storage(self):
        # Rank 0 waits for its dcp.async_save (a thread of torch's writes it to slow storage),
        # rank 1 for its own, whose thread waits for rank 0's in the checkpoint's collective: a
        # checkpoint of rank 0's own, not a rank that does nothing ("hang suspected ... rank 0,
        # which does nothing").
        job = self.check("async-save")
        self.assertNotIn("hang suspected", job.proc.stderr)
        self.assertGreaterEqual(len(job.events("hang_suspected")), 1, job.proc.stderr)
        for event in job.events("hang_suspected"):
            (rank0,) = [r for r in event["ranks"] if r["rank"] == 0]
            self.assertIn("in torch.distributed.checkpoint", rank0["doing"], rank0)

    def test_a_rank_writing_checkpoints_while_the_other_waits(self):
        job = self.check("save")
        for event in job.events("hang_suspected"):
            (rank0,) = [r for r in event["ranks"] if r["rank"] == 0]
            self.assertTrue(rank0["active"], rank0)
            # Named by its stack, or (the GIL held through a write: the sampler's last look may
            # be from the state dict's making, and a thread that runs is not signalled) by what
            # its I/O shows, beside the CPU the pickling takes.
            what = rank0["doing"] + rank0["where"]
            self.assertTrue("torch.save" in what or "writing (" in rank0["doing"], rank0)
        self.assertNotIn("hang suspected", job.proc.stderr, "a rank that writes is working")

    def test_a_rank_evaluating_while_the_other_waits(self):
        job = self.check("eval")
        for event in job.events("hang_suspected"):
            (rank0,) = [r for r in event["ranks"] if r["rank"] == 0]
            self.assertTrue(rank0["active"], rank0)
        self.assertNotIn("hang suspected", job.proc.stderr, "a rank that computes is working")

    def test_a_pause_between_steps_while_the_other_waits_in_ddps_all_reduce(self):
        job = self.check("between")
        for event in job.events("hang_suspected"):
            (rank0,) = [r for r in event["ranks"] if r["rank"] == 0]
            self.assertTrue(rank0["waiting"], rank0)

    def test_every_rank_stalling(self):
        self.check("all")

    def test_the_scripts_own_collective_timeout(self):
        self.check("timeout")

    def test_a_long_first_step(self):
        job = self.check("first-step")
        self.assertEqual(job.events("hang_suspected"), [], "no step yet: no hang timeout yet")

    def test_a_dataloader_with_workers_and_a_forked_trainer_leave_the_counts_alone(self):
        job = self.check("loader")
        for rank in (0, 1):
            m = re.search(rf"rank {rank} done steps (\d+) hook (\d+)", job.proc.stdout)
            self.assertEqual(m.group(1), m.group(2), "the forked processes' steps are not counted")

    def test_no_optimizer_step_at_all(self):
        job = self.check("no-optimizer")
        self.assertEqual(job.events("hang_suspected"), [], "no step: no hang timeout")

    def test_gradient_accumulation(self):
        self.check("accumulate")

    def test_a_rank_logging_to_a_slow_network_service(self):
        job = self.check("slow-log")
        for event in job.events("hang_suspected"):
            (rank0,) = [r for r in event["ranks"] if r["rank"] == 0]
            if not rank0["active"]:  # blocked in its send: said, with the service's address
                self.assertIn("blocked writing to a socket to 127.0.0.1:", rank0["doing"], rank0)

    def test_a_c_call_that_holds_the_gil_in_poll(self):
        # The sampler cannot run: the agent used to signal the main thread for its stack, and
        # the handler broke the C call's poll() (EINTR at 31 s of 36: the worker failed).
        self.check("c-poll")

    def test_a_rank_working_alone_after_the_others_finished_past_the_collective_timeout(self):
        # No rank is left to wait for it: neither ended past the job's collective timeout and its
        # margin (it was, at 70 s: SIGKILL, exit 137), nor warned of, nor marked as a suspect.
        job = self.check("alone")
        self.assertIn("rank 1 worked alone after the job", job.proc.stdout)
        self.assertIn("rank 1 is the job's only running rank (the others finished) and waits in "
                      "no collective", job.proc.stderr)
        self.assertNotIn("hang suspected", job.proc.stderr)
        for event in job.events("hang_suspected"):
            self.assertFalse(any(r["suspect"] for r in event["ranks"]), event)

    def test_a_monitored_barrier_with_a_timeout_longer_than_its_groups(self):
        # Rank 0 waits in dist.monitored_barrier(timeout=165 s) while rank 1 works 105 s: past
        # its group's timeout (10 s) and the agent's margin, within the barrier's own. Rank 1 was
        # ended there (SIGKILL at the look about 99 s in, exit 137: the bound read the groups'
        # timeouts alone).
        self.check("monitored")

    def test_an_evaluation_whose_collectives_complete_however_long_without_a_step(self):
        # 105 s without an optimizer step, its scores all-reduced batch by batch while rank 0
        # scores each for 3 s: rank 1's waits are 3 s, far within the group's timeout (10 s).
        # Rank 0 was ended at the look past that timeout and its margin (the bound read the
        # silence since the last step, not the wait: a helper's evaluation, exit 137 at 104 s).
        self.check("scoring")

    def test_ranks_pickling_and_unpickling_inside_object_collectives(self):
        # Both ranks in an object collective's call at the same count (rank 0 in gather_object,
        # unpickling; rank 1 in broadcast_object_list, pickling): neither waits in a collective,
        # so no collectives that can never match (before: "collective #N can never complete:
        # rank 1 in broadcast, rank 0 in gather", both SIGKILLed at 33 s).
        job = self.check("objects")
        self.assertNotIn("can never", job.proc.stderr)

    def test_a_thread_of_the_scripts_own_issues_what_the_other_rank_waits_for(self):
        # Rank 1's main thread in a barrier, rank 0's in a broadcast that rank 1's producer
        # thread (asleep meanwhile) issues after the pause: each main thread waits in what the
        # other's has not issued, a cycle of waits but for the thread (before: "collectives
        # that can never match ... ranks 0 and 1 wait for each other", both SIGKILLed at 33 s).
        job = self.check("producer")
        self.assertNotIn("can never", job.proc.stderr)

    def test_a_send_numbered_on_two_ranks_only_is_no_mismatch_of_the_third(self):
        # Three ranks: after a send from rank 0 to rank 1, rank 0's gather and rank 2's next
        # all_reduce have the same number while rank 1 computes (before: "collective #27 can
        # never complete: rank 2 in all_reduce, rank 0 in gather", ranks 0 and 2 SIGKILLed).
        job = self.check("p2p-offset")
        self.assertNotIn("can never", job.proc.stderr)
        self.assertIn("rank 2 done steps", job.proc.stdout)

    def test_a_rank_out_of_data_under_ddps_join_is_no_straggler(self):
        # Rank 1's step time grew without bound while it shadowed rank 0's all-reduces (no step
        # of its own): it was compared by step time and flagged (9.9x on torch 2.x, 34x on 1.13).
        self.check("join")

    def test_counts_skewed_by_sends_name_the_rank_at_work_not_the_ones_waiting_for_it(self):
        # After a monitored_barrier (torch 2.x counts its sends and receives, more of them on rank 0),
        # ranks 1 and 2 waiting in rank 0's broadcast read as behind it: they were the suspects
        # ("the others wait for ranks 1, 2, which do nothing"), and an explicit --hang-timeout
        # ended them. Rank 0, computing, is the one they wait for: not a hang.
        job = self.check("skewed")
        for event in job.events("hang_suspected"):
            self.assertEqual([r["rank"] for r in event["ranks"] if r["suspect"]], [0], event)
        self.assertNotIn("which do nothing", job.proc.stderr)
        self.assertIn("rank 2 done steps", job.proc.stdout)

    def test_a_collective_of_a_thread_of_the_scripts_own_while_the_main_thread_works(self):
        # Rank 0's main thread in its model's forward inside DDP's (the script's own code: no
        # wait of torch.distributed), its own thread's all-reduce on a group of its own pending:
        # before, the main thread was taken to wait in that group's collective, rank 1 in DDP's
        # all-reduce, a cycle of waits: both SIGKILLed.
        job = self.check("side-thread")
        self.assertNotIn("can never", job.proc.stderr)
        for event in job.events("hang_suspected"):
            (rank0,) = [r for r in event["ranks"] if r["rank"] == 0]
            self.assertFalse(rank0["waiting"], rank0)

    def test_a_declared_pause_is_reported_as_a_pause(self):
        job = self.check("paused")
        self.assertNotIn("hang suspected", job.proc.stderr)
        for event in job.events("hang_suspected"):
            (rank0,) = [r for r in event["ranks"] if r["rank"] == 0]
            self.assertTrue(rank0["paused"], rank0)
            self.assertTrue(rank0["doing"].startswith("paused: checkpoint"), rank0)
        # Progress again only once rank 0's pause ended (it was said right after each report: the
        # waiting rank's last step came after the paused one's, and the pause was left out)
        for event in job.events("hang_cleared"):
            self.assertGreaterEqual(event["silent_ms"], PAUSE_S * 1000 - 500, event)

    def test_compiled_collectives_functional_collectives_and_dtensor(self):
        job = self.check("compile")
        for rank in (0, 1):
            self.assertIn(f"rank {rank} compiled, functional collectives and DTensor",
                          job.proc.stdout)


def main():
    launcher_test_main.main(sys.modules[__name__])


if __name__ == "__main__":
    main()
