"""In-place recovery of torch DDP jobs with dist_launch.elastic (examples/torch/elastic_train.py)
under `dist-launch --restart-policy in-place`: a worker killed mid-training is replaced alone, the
survivors keep their processes (one pid each from start to end), the replacement receives their
state by broadcast, and every rank ends with the weights of an uninterrupted run of the same job,
computed here first (two workers). Also: four workers (every survivor recovers, the replicas
equal), an exception rather than a
signal, a warm (forked) replacement, two nodes of elastic rendezvous (c10d), and the same script
under the group policy (restarted from the start, as torchrun would, with the same weights).

    python3 elastic_test.py --launcher build/bin/dist-launch --python /usr/bin/python3
Exits 77 (skip) when that interpreter has no torch (or not --require-major).
"""
import collections
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import launcher_test_main

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "examples", "torch", "elastic_train.py")
ARGS = None
STEPS = "30"


wait_for_listener = launcher_test_main.wait_for_listener


class ElasticAgents:
    """The agents of one elastic in-place job (--nnodes `nnodes`, 2:3 by default; c10d on
    127.0.0.2) of one worker each, started one by one, each read by a thread of its own; the first
    hosts the store."""

    def __init__(self, test, rdzv_id, *extra, script_args=(), nnodes="2:3"):
        self.test = test
        self.port = launcher_test_main.free_port("127.0.0.2")
        self.env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
        self.cmd = [ARGS.launcher, "--nnodes", nnodes, "--rdzv-endpoint",
                    f"127.0.0.2:{self.port}", "--rdzv-id", rdzv_id, *extra, "--nproc-per-node",
                    "1", "--restart-policy", "in-place", "--max-restarts", "1", SCRIPT, "--steps",
                    STEPS, "--pause-ms", "100", "--timestamps", *script_args]
        self.procs, self.lines, self.readers = [], [], []

    def start(self):
        p = subprocess.Popen(self.cmd, env=self.env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        self.test.addCleanup(p.stdout.close)
        self.test.addCleanup(p.wait)
        self.test.addCleanup(p.kill)
        self.procs.append(p)
        self.lines.append([])
        self.readers.append(threading.Thread(
            target=lambda p=p, out=self.lines[-1]: out.extend(p.stdout), daemon=True))
        self.readers[-1].start()
        if len(self.procs) == 1:  # it hosts the store: the others join as its clients
            wait_for_listener("127.0.0.2", self.port, p)

    def text(self, i):
        return "".join(self.lines[i])

    def wait_for(self, found, timeout=120):
        """The first agent whose output so far satisfies `found`, polled until `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(len(self.procs)):
                if found(self.text(i)):
                    return i
            time.sleep(0.01)
        raise AssertionError([self.text(i) for i in range(len(self.procs))])

    def finish(self, agents):
        """Waits for every agent; the output of `agents` (each of which must exit 0) as a Run."""
        deadline = time.monotonic() + 180
        for p in self.procs:
            try:
                p.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:  # what each agent said, not only that one hung
                for q in self.procs:
                    q.kill()
                for reader in self.readers:
                    reader.join(timeout=30)
                self.test.fail("agents still running after 180 s:\n" + "\n".join(
                    f"--- agent {i} (exit {q.poll()}):\n{self.text(i)[-6000:]}"
                    for i, q in enumerate(self.procs)))
        for reader in self.readers:  # until each output's end
            reader.join(timeout=30)
        run = Run(subprocess.CompletedProcess([], 0, "".join(self.text(i) for i in agents), ""))
        self.test.assertEqual([self.procs[i].returncode for i in agents], [0] * len(agents),
                              run.out)
        return run


class Run:
    def __init__(self, proc):
        self.proc = proc
        self.out = proc.stdout + proc.stderr
        self.pids = collections.defaultdict(list)  # rank: the pids that started as it
        for m in re.finditer(r"rank (\d+) pid (\d+) started", self.out):
            self.pids[int(m.group(1))].append(int(m.group(2)))
        self.ends = {int(m.group(1)): (int(m.group(2)), m.group(3))
                     for m in re.finditer(r"rank (\d+) pid (\d+) generation \d+ steps "
                                          + STEPS + r" digest (\w+)", self.out)}

        self.weights = {int(m.group(1)): (float(m.group(2)), float(m.group(3)))
                        for m in re.finditer(r"rank (\d+) weights sum (\S+) sumsq (\S+)",
                                             self.out)}

    def digests(self):
        return {rank: digest for rank, (_, digest) in self.ends.items()}


class InPlace(unittest.TestCase):
    baselines = {}
    baseline_weights = {}

    def launch(self, nproc, *extra, script_args=(), env=None):
        # PYTHONFAULTHANDLER: a worker that dies of a signal of its own prints every thread's
        # Python stack. (Workers aborted in their teardown, "terminate called without an active
        # exception": torch 2.x's last gloo work of a backward, freed on a gloo thread while the
        # interpreter finalized; elastic.run now frees it before: see _freed_after.)
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo",
                   PYTHONFAULTHANDLER="1", **(env or {}))
        cmd = [ARGS.launcher, "--nproc-per-node", str(nproc), *extra, SCRIPT, "--steps", STEPS,
               *script_args]
        return Run(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240))

    def baseline(self, nproc):
        """Every rank's digest after an uninterrupted run (one value: DDP keeps them equal)."""
        if nproc not in self.baselines:
            run = self.launch(nproc)
            self.assertEqual(run.proc.returncode, 0, run.out)
            digests = set(run.digests().values())
            self.assertEqual(len(run.digests()), nproc, run.out)
            self.assertEqual(len(digests), 1, run.out)
            self.baselines[nproc] = digests.pop()
            self.baseline_weights[nproc] = run.weights[0]
        return self.baselines[nproc]

    def check_in_place(self, run, nproc, failed=1, bit_identical=True):
        self.assertEqual(run.proc.returncode, 0, run.out)
        self.assertIn("replaced in place", run.out)
        self.assertRegex(run.out, r"generation 1: the group is whole again, \d+ ms after worker "
                         + str(failed) + " failed")
        self.assertRegex(run.out, rf"rank {failed} joined generation 1 as a replacement: state "
                                  r"from rank \d \(step=\d+\)")
        for rank in range(nproc):
            if rank == failed:
                self.assertEqual(len(run.pids[rank]), 2, run.out)  # the first and its replacement
                self.assertEqual(run.ends[rank][0], run.pids[rank][1], run.out)
            else:  # one process from start to end
                self.assertEqual(len(run.pids[rank]), 1, run.out)
                self.assertEqual(run.ends[rank][0], run.pids[rank][0], run.out)
                self.assertRegex(run.out, rf"rank {rank} recovered in place: generation 1")
        if bit_identical:
            self.assertEqual(run.digests(), {r: self.baseline(nproc) for r in range(nproc)},
                             run.out)
        else:
            self.check_near_baseline(run, nproc)

    def check_near_baseline(self, run, nproc):
        """The replicas equal each other, and the uninterrupted run's weights but for rounding."""
        self.assertEqual(len(run.digests()), nproc, run.out)
        self.assertEqual(len(set(run.digests().values())), 1, run.out)
        self.baseline(nproc)
        expected = self.baseline_weights[nproc]
        for rank in range(nproc):
            for got, want in zip(run.weights[rank], expected):
                # A summation order moves the last digits; a step applied twice or skipped moves
                # them by about 1e-2 of their size (lr 0.05).
                self.assertLess(abs(got - want), 1e-4 * abs(want), (rank, run.weights, expected))

    def launch_with_fault(self, nproc, script_args, when, fault):
        """A job of `nproc` workers in place whose output is read as it comes: at the first line
        for which `when(line)` is true, `fault(agent's pid, pids)` runs (pids: each rank's first
        process).
        Returns the Run (the job must exit 0) and those pids. --in-place-timeout bounds a recovery
        that does not come: a group restart, not a test that hangs."""
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
        cmd = [ARGS.launcher, "--nproc-per-node", str(nproc), "--restart-policy", "in-place",
               "--max-restarts", "2", "--in-place-timeout", "60", SCRIPT, "--steps", STEPS,
               "--pause-ms", "100", *script_args]
        agent = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        self.addCleanup(agent.stdout.close)
        self.addCleanup(agent.wait)
        self.addCleanup(agent.kill)
        lines, pids = [], {}
        for line in agent.stdout:
            lines.append(line)
            m = re.search(r"rank (\d+) pid (\d+) started", line)
            if m:
                pids.setdefault(int(m.group(1)), int(m.group(2)))
            if when(line):
                fault(agent.pid, pids)
                break
        lines.extend(agent.stdout)
        self.assertEqual(agent.wait(timeout=180), 0, "".join(lines))
        return Run(subprocess.CompletedProcess([], 0, "".join(lines), "")), pids

    def test_a_killed_worker_is_replaced_and_training_ends_as_if_uninterrupted(self):
        run = self.launch(2, "--restart-policy", "in-place", "--max-restarts", "2",
                          script_args=("--crash-at-step", "12"))
        self.check_in_place(run, 2)

    def test_with_four_workers_every_survivor_recovers_from_an_exception(self):
        # Rank 3 talks to the dead rank 1 in no step of gloo's ring: it wakes because its peers
        # shut their sockets down, or its own watcher does when the next generation comes.
        run = self.launch(4, "--restart-policy", "in-place", "--max-restarts", "2",
                          script_args=("--crash-at-step", "9", "--crash-how", "exit"))
        # Four ranks sum a gradient in an order that depends on where it sits in DDP's bucket,
        # whose layout the rebuilt DDP learns again: the replicas equal each other, not the
        # uninterrupted run's weights to the bit (two ranks: a + b, in either order).
        self.check_in_place(run, 4, bit_identical=False)
        self.assertIn("RuntimeError: injected failure at step 9", run.out)

    def test_with_eight_workers_the_survivors_end_with_the_uninterrupted_weights(self):
        # Eight ranks on a ring: when rank 5 exits mid-step, each survivor is stopped where the
        # ring has it (sending to 5, receiving from 4, waiting on a peer further round, or past
        # the bucket), and each leaves from there into generation 1.
        run = self.launch(8, "--restart-policy", "in-place", "--max-restarts", "2",
                          script_args=("--crash-at-step", "9", "--crash-rank", "5",
                                       "--crash-how", "exit"))
        self.check_in_place(run, 8, failed=5, bit_identical=False)
        self.assertIn("RuntimeError: injected failure at step 9", run.out)

    def test_a_replacement_dying_between_publishing_its_addresses_and_connecting(self):
        # Rank 2 crashes; its replacement (generation 1) exits as soon as gloo has published its
        # addresses, before it connects to any peer (DIST_LAUNCH_FAULT: nothing else places a
        # death in that window). A survivor on the listening side of its pair with it (torch
        # 2.x: all of them, the newer process connects; 1.13: by chance) waited for a connection
        # that never came until --in-place-timeout (60 s here, 300 by default), and the group
        # restarted. Now the agent folds the failure into generation 2 and every survivor
        # leaves generation 1's set-up for it, keeping its process: its listening socket is
        # connected to in the dead rank's place (and every other's), and the waiting pair is
        # handed a closed connection. (The last resort, a survivor still waiting after
        # STUCK_COLLECTIVE_S, 2 s here, leaving to be started again, must not be needed.)
        dying = 2
        began = time.monotonic()
        run = self.launch(5, "--restart-policy", "in-place", "--max-restarts", "6",
                          "--in-place-timeout", "60",
                          script_args=("--crash-at-step", "6", "--crash-rank", str(dying)),
                          env={"DIST_LAUNCH_FAULT": f"exit-after-publishing:{dying}:1",
                               "DIST_LAUNCH_STUCK_COLLECTIVE_S": "2"})
        took = time.monotonic() - began
        self.assertEqual(run.proc.returncode, 0, run.out)
        self.assertIn(f"rank {dying}: exiting after publishing this rank's addresses", run.out)
        self.assertIn("folded into the recovery under way (generation 1, which it supersedes: "
                      f"rank {dying} replaced)", run.out)
        self.assertNotIn("restarting", run.out)
        self.assertLess(took, 60, "a survivor waited out the in-place timeout:\n" + run.out)
        self.assertNotIn("set-up stayed idle", run.out)
        for rank in set(range(5)) - {dying}:  # the survivors: one process each
            self.assertEqual(len(run.pids[rank]), 1, run.out)
            self.assertEqual(run.ends[rank][0], run.pids[rank][0], run.out)
            self.assertRegex(run.out, rf"rank {rank}: generation 1('s group did not form \(.*\); "
                                      rf"joining generation 2| was superseded before its set-up)")
        self.assertEqual(run.ends[dying][0], run.pids[dying][-1], run.out)
        self.check_near_baseline(run, 5)

    def test_a_worker_dying_in_the_first_groups_set_up_is_replaced_in_place(self):
        # Rank 1 dies inside the job's first init_process_group, once gloo has published its
        # addresses (DIST_LAUNCH_FAULT; a SIGKILL there by hand did the same, 5 runs of 9): the
        # agent replaces it in generation 1, which nobody followed. The others waited in
        # generation 0's set-up for a peer that would never come until --in-place-timeout (the
        # group then restarted: with --max-restarts 1 the job failed), or their set-up failed
        # and the whole group restarted. Now they leave generation 0 for generation 1, keep
        # their processes and take the replacement into their group.
        began = time.monotonic()
        run = self.launch(3, "--restart-policy", "in-place", "--max-restarts", "1",
                          "--in-place-timeout", "60",
                          env={"DIST_LAUNCH_FAULT": "exit-after-publishing:1:0",
                               "DIST_LAUNCH_STUCK_COLLECTIVE_S": "2"})
        took = time.monotonic() - began
        self.assertEqual(run.proc.returncode, 0, run.out)
        self.assertIn("rank 1: exiting after publishing this rank's addresses", run.out)
        self.assertNotIn("restarting", run.out)
        self.assertLess(took, 60, "a survivor waited out the in-place timeout:\n" + run.out)
        self.assertNotIn("set-up stayed idle", run.out)
        self.assertNotIn("nanobind: leaked", run.out)  # (gc.freeze undone at exit)
        for rank in (0, 2):
            self.assertEqual(len(run.pids[rank]), 1, run.out)
            self.assertEqual(run.ends[rank][0], run.pids[rank][0], run.out)
            # (Its set-up left for generation 1; or, handed a connection in rank 1's place, it
            # formed, and its first collective failed.)
            self.assertRegex(run.out, rf"rank {rank} recovered in place: generation 1\b.*, "
                                      r"state from rank 0")
        self.assertRegex(run.out, r"rank 1 joined generation 1 as a replacement: state from "
                                  r"rank 0")
        self.assertEqual(run.ends[1][0], run.pids[1][-1], run.out)
        self.check_near_baseline(run, 3)

    def test_two_workers_reaped_together_are_replaced_in_one_generation(self):
        # The agent held (SIGSTOP) while ranks 1 and 2 are SIGKILLed reaps both in one batch:
        # one generation replaces both (before: "2 workers failed at once" restarted the whole
        # group).
        def kill_both(agent, pids):
            self.assertEqual(set(pids), {0, 1, 2, 3})
            reap_together(agent, [pids[1], pids[2]])

        run, pids = self.launch_with_fault(
            4, ("--timestamps",), lambda line: re.search(r"rank 2 pid \d+ step 5 done", line),
            kill_both)
        self.assertIn("generation 1 (restart 2 of 2) with ranks 1,2; ranks 0,3 keep running",
                      run.out)
        self.assertNotIn("restarting", run.out)
        for rank in (1, 2):
            self.assertRegex(run.out, rf"rank {rank} joined generation 1 as a replacement: state "
                                      r"from rank 0 \(step=\d+\)")
            self.assertEqual(len(run.pids[rank]), 2, run.out)
            self.assertEqual(run.ends[rank][0], run.pids[rank][1], run.out)
        for rank in (0, 3):
            self.assertEqual(run.pids[rank], [pids[rank]], run.out)
            self.assertEqual(run.ends[rank][0], pids[rank], run.out)
            self.assertRegex(run.out, rf"rank {rank} recovered in place: generation 1")
        self.check_near_baseline(run, 4)  # four ranks: not to the bit (summation order)

    def test_a_failure_during_the_recovery_is_folded_into_it(self):
        # Rank 1 crashes; rank 2 is killed as soon as its replacement is started, while it
        # (torch to import) is starting and rank 0 waits in generation 1's set-up for both. The
        # agent folds rank 2's failure into the recovery: generation 2 replaces both, rank 0 gives
        # generation 1's set-up up for it (before: the whole group restarted). (Killed when rank
        # 1's failure is only reported, rank 2 may die while the agent settles that failure, and
        # both are then one failure that generation 1 replaces: right, but not this test's case.)
        run, pids = self.launch_with_fault(
            3, ("--crash-at-step", "12"),
            lambda line: "worker 1 (local rank 1) replaced in place by pid" in line,
            lambda agent, pids: os.kill(pids[2], signal.SIGKILL))
        self.assertIn("folded into the recovery under way (generation 1, which it supersedes: "
                      "ranks 1,2 replaced)", run.out)
        self.assertNotIn("restarting", run.out)
        # Rank 1's replacement started as generation 1 and followed to 2 (rank 0 may have read
        # the counter past 1 before it began, and joined 2 at once).
        self.assertRegex(run.out, r"rank 1: generation 1('s group did not form \(.*\); joining "
                                  r"generation 2, which supersedes it| was superseded before its "
                                  r"set-up began; joining generation 2)")
        self.assertRegex(run.out, r"rank 0 recovered in place: generation 2")
        self.assertEqual(run.pids[0], [pids[0]], run.out)
        self.assertEqual(run.ends[0][0], pids[0], run.out)
        for rank in (1, 2):
            self.assertEqual(run.ends[rank][0], run.pids[rank][-1], run.out)
        self.check_near_baseline(run, 3)

    def test_the_workers_store_keeps_no_keys_of_past_generations(self):
        # Rank 1 and each replacement crash every 4 steps: seven recoveries in one job. Each
        # generation's torch process group leaves its keys in the workers' store (gloo's
        # addresses, its barrier), and the workers' records theirs; once a generation recovered,
        # the agent deletes those of the generations before it. Rank 0, alive throughout, counts
        # the store's keys after each recovery: flat, not growing with every recovery.
        run = self.launch(2, "--restart-policy", "in-place", "--max-restarts", "20",
                          script_args=("--crash-every", "4", "--store-keys"))
        self.assertEqual(run.proc.returncode, 0, run.out)
        counts = {int(g): int(n) for g, n in
                  re.findall(r"rank 0 generation (\d+) store keys (\d+)", run.out)}
        self.assertEqual(sorted(counts), list(range(1, 8)), run.out)
        # The cleanup of generation g-1 (or, on a loaded machine, of the one before) may still
        # run when rank 0 counts after g: a later count may be higher for a moment, but keys
        # that leaked would raise every later count, one generation's keys per recovery.
        settled = max(counts[2], counts[3])
        later = [counts[g] for g in range(4, 8)]
        self.assertLessEqual(min(later), settled, counts)
        self.assertLessEqual(max(later), 2 * settled, counts)
        self.assertEqual(len(run.pids[0]), 1, run.out)  # the survivor lived through them all
        self.assertEqual(run.digests(), {r: self.baseline(2) for r in range(2)}, run.out)

    def test_a_warm_replacement_is_forked_from_the_zygote(self):
        # A zygote of numpy alone is ready within the first attempt even on a loaded machine (one
        # of torch may not be, and the replacement would then start cold, correctly but untested).
        run = self.launch(2, "--restart-policy", "in-place", "--max-restarts", "2",
                          "--warm-restart", "--preload", "numpy",
                          script_args=("--crash-at-step", "12"))
        self.check_in_place(run, 2)
        self.assertRegex(run.out, r"zygote pid \d+ ready")
        if "round 0: 2 of 2 workers forked from the zygote" in run.out:  # ready before the crash
            self.assertIn("the replacement of worker 1 (local rank 1) was forked from the zygote",
                          run.out)

    def test_a_commit_every_few_steps_redoes_the_steps_since(self):
        run = self.launch(2, "--restart-policy", "in-place", "--max-restarts", "2",
                          script_args=("--crash-at-step", "13", "--commit-every", "5"))
        self.check_in_place(run, 2)
        self.assertRegex(run.out, r"rank 0 recovered in place: generation 1, state from rank 0 "
                                  r"\(step=10\)")

    def test_across_two_nodes_of_elastic_rendezvous(self):
        # Two agents of one worker each behind c10d rendezvous (the store on 127.0.0.2): rank 1's
        # node replaces it alone, rank 0's node runs on, untouched.
        port = launcher_test_main.free_port("127.0.0.2")
        env = dict(os.environ, PYTHON_EXEC=ARGS.python, GLOO_SOCKET_IFNAME="lo")
        procs = []
        for _ in range(2):
            cmd = [ARGS.launcher, "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.2:{port}",
                   "--rdzv-id", "elastic-inplace", "--nproc-per-node", "1", "--restart-policy",
                   "in-place", "--max-restarts", "2", SCRIPT, "--steps", STEPS, "--crash-at-step",
                   "12"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
            if len(procs) == 1:  # it hosts the store: the second joins as its client
                wait_for_listener("127.0.0.2", port, procs[0])
        outputs = [p.communicate(timeout=240)[0] for p in procs]
        codes = [p.returncode for p in procs]
        run = Run(subprocess.CompletedProcess([], max(codes, key=abs), outputs[0] + outputs[1], ""))
        self.check_in_place(run, 2)
        self.assertNotIn("restarting", run.out)

    def test_a_lost_nodes_survivors_train_on_in_a_smaller_world(self):
        # Three agents of one worker each (--nnodes 2:3); node 1's agent is SIGKILLed mid-training
        # (its worker goes with it). Nobody replaces it: the other two keep their processes and
        # go on as ranks 0 and 1 of two (node 2's worker renumbered), with equal weights.
        job = ElasticAgents(self, "elastic-regroup")
        for _ in range(3):
            job.start()
        lost = job.wait_for(lambda text: "round 0: node 1 of 3" in text and
                            re.search(r"rank 1 pid \d+ step 3 done", text))
        job.procs[lost].send_signal(signal.SIGKILL)
        job.procs[lost].wait(timeout=30)
        survivors = [i for i in range(3) if i != lost]
        run = job.finish(survivors)
        self.assertEqual(sorted(run.ends), [0, 1], run.out)
        self.assertEqual(len(set(run.digests().values())), 1, run.out)
        self.assertRegex(run.out, r"rank 1 pid \d+ generation 1 steps " + STEPS
                         + r" digest \w+ world 2")
        self.assertIn("rank 2 is rank 1 of 2 from generation 1 (the job regrouped in round 1)",
                      run.out)
        # One process each, from start to end: rank 1's is the one that started as rank 2.
        self.assertEqual(run.ends[0][0], run.pids[0][0], run.out)
        self.assertEqual(run.ends[1][0], run.pids[2][0], run.out)
        self.assertIn("regrouped in round 1 (node 1 was lost): world 2", run.out)
        self.assertNotIn("restarting", run.out)
        self.assertNotIn("stopping the workers", run.out)

    def test_a_relaunched_node_rejoins_the_survivor_whose_worker_waited_in_place(self):
        # --nnodes 2 (MIN = MAX): node 1's agent is SIGKILLed mid-training, and started again (a
        # cluster manager's relaunch) once node 0 says its worker waits in place. The relaunched
        # node's worker joins the survivor's group as a newcomer's does and receives its state:
        # rank 0 is one process from start to end, and both end with the uninterrupted weights.
        job = ElasticAgents(self, "elastic-relaunch", nnodes="2")
        job.start()
        job.start()
        lost = job.wait_for(lambda text: "round 0: node 1 of 2" in text and
                            re.search(r"rank 1 pid \d+ step 3 done", text))
        job.procs[lost].send_signal(signal.SIGKILL)
        job.procs[lost].wait(timeout=30)
        survivor = 1 - lost
        job.wait_for(lambda text: "wait in place for nodes to join" in text)
        job.start()  # node 1's agent, relaunched
        run = job.finish([survivor, 2])
        self.assertEqual(sorted(run.ends), [0, 1], run.out)
        self.assertEqual(len(set(run.digests().values())), 1, run.out)
        self.assertEqual(run.ends[0][0], run.pids[0][0], run.out)  # one process, start to end
        self.assertNotIn("restarting", run.out)
        self.assertNotIn("stopping the workers", run.out)
        self.baseline(2)
        for rank in (0, 1):
            for got, want in zip(run.weights[rank], self.baseline_weights[2]):
                self.assertLess(abs(got - want), 1e-4 * abs(want), (rank, run.weights))

    def test_a_newcomer_joins_the_running_workers_in_a_larger_world(self):
        # Two agents of one worker each (--nnodes 2:3) train; a third agent starts midway. The two
        # keep their processes and take its worker in (the watcher aborts their collective when
        # node 0 publishes the regroup's generation): ranks 0..2 of three, equal weights. The two
        # hold at step 20 until it is in, however long its worker takes to start (4 s of a 30-step
        # job's 4 s, seen in CI with torch 2.15).
        job = ElasticAgents(self, "elastic-newcomer", "--rdzv-conf", "last_call_timeout=1",
                            script_args=("--hold-at-step", "20", "--hold-until-world", "3"))
        job.start()
        job.start()
        job.wait_for(lambda text: re.search(r"rank 1 pid \d+ step 3 done", text))
        job.start()
        run = job.finish([0, 1, 2])
        self.assertEqual(sorted(run.ends), [0, 1, 2], run.out)
        self.assertEqual(len(set(run.digests().values())), 1, run.out)
        self.assertRegex(run.out, r"rank 2 pid \d+ generation 1 steps " + STEPS
                         + r" digest \w+ world 3")
        # One process each, from start to end; the newcomer's started as generation 1.
        for rank in range(3):
            self.assertEqual([run.ends[rank][0]], run.pids[rank], run.out)
        self.assertIn("rank 2 pid %d started (generation 1)" % run.ends[2][0], run.out)
        self.assertIn("regrouped in round 1 (a node is waiting to join): world 3, 1 node(s) new",
                      run.out)
        self.assertIn("round 1: this node's workers joined the running workers as generation 1",
                      job.text(2))
        self.assertNotIn("restarting", run.out)
        self.assertNotIn("stopping the workers", run.out)

    def test_a_worker_crashing_at_exit_after_the_others_finished_ends_the_job_done(self):
        # Rank 1 is SIGKILLed in its teardown once rank 0 has exited: there is no group left to
        # rejoin. The job ends done with the trained weights, no replacement, no restart (it used
        # to wait 300 s for the gone group, then train everything again: issue 43).
        run = self.launch(2, "--restart-policy", "in-place", "--max-restarts", "2",
                          script_args=("--crash-at-exit",))
        self.assertEqual(run.proc.returncode, 0, run.out)
        self.assertIn("rank 1 crashing at exit", run.out)
        self.assertIn("worker 1 (local rank 1) failed after every other worker of the job had "
                      "finished: nothing is left to recover in place, and the job is done", run.out)
        self.assertNotIn("replaced in place", run.out)
        self.assertNotIn("restarting the worker group", run.out)
        self.assertEqual({rank: len(pids) for rank, pids in run.pids.items()}, {0: 1, 1: 1},
                         run.out)
        self.assertEqual(run.digests(), {r: self.baseline(2) for r in range(2)}, run.out)

    def test_a_worker_failing_in_its_training_function_after_the_others_finished_restarts(self):
        # Rank 1 raises inside its training function after its last step, once rank 0 has
        # exited (its part of the result not written). Not a crash at exit: the job used to end
        # "done" with exit 0, its failure unsaid in the exit code. Its work/<rank> said it was
        # still at work: the group restarts, as under torchrun, and trains to the same weights.
        run = self.launch(2, "--restart-policy", "in-place", "--max-restarts", "2",
                          script_args=("--fail-before-returning",))
        self.assertEqual(run.proc.returncode, 0, run.out)
        self.assertIn("rank 1: cannot write its part of the result (injected)", run.out)
        self.assertIn("worker 1 failed inside its training function (dist_launch.elastic's run "
                      "had not returned), and every other worker of the job has finished: its "
                      "work is not done, and nobody is left to recover it from in place: "
                      "restarting the whole group", run.out)
        self.assertNotIn("the job is done", run.out)
        self.assertIn("restarting the worker group", run.out)
        self.assertEqual(run.digests(), {r: self.baseline(2) for r in range(2)}, run.out)

    def test_under_the_group_policy_the_same_script_restarts_from_the_start(self):
        run = self.launch(2, "--max-restarts", "1", script_args=("--crash-at-step", "12"))
        self.assertEqual(run.proc.returncode, 0, run.out)
        self.assertNotIn("replaced in place", run.out)
        self.assertIn("restarting the worker group", run.out)
        self.assertEqual([len(run.pids[r]) for r in range(2)], [2, 2], run.out)
        self.assertEqual(run.digests(), {r: self.baseline(2) for r in range(2)}, run.out)


def start_store(test):
    """A dist-rendezvous daemon on a free port, stopped at the test's end: the port."""
    daemon = subprocess.Popen([os.path.join(os.path.dirname(ARGS.launcher), "dist-rendezvous"),
                               "--host", "127.0.0.1", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    test.addCleanup(daemon.wait)
    test.addCleanup(daemon.kill)
    test.addCleanup(daemon.stdout.close)
    for line in daemon.stdout:
        m = re.search(r"listening on \S*?:(\d+)", line)
        if m:
            return int(m.group(1))
    test.fail("dist-rendezvous said no port")


def worker_env(port, run_id, rank, world_size, **extra):
    """An in-place worker's environment as dist-launch gives it, without the agent."""
    python = os.path.join(HERE, "..", "..", "python")
    return dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=run_id,
                DIST_LAUNCH_RESTART_POLICY="in-place", DIST_LAUNCH_GENERATION="0",
                TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0",
                GLOO_SOCKET_IFNAME="lo",
                PYTHONPATH=os.pathsep.join(p for p in (python, os.environ.get("PYTHONPATH")) if p),
                **extra)


def publish_generation_1(port, run_id):
    """What the agent writes when it publishes a group's next generation."""
    import datetime
    import torch.distributed as dist
    client = dist.TCPStore("127.0.0.1", port, 1, False, timeout=datetime.timedelta(seconds=30))
    client.set(f"dist_launch/inplace/{run_id}/attempt_0/gen/1", "replaced=1 survivors=0")


class GroupTimeout(unittest.TestCase):
    def test_the_agents_in_place_timeout_bounds_a_generations_group(self):
        # dist-launch --in-place-timeout reaches the worker as DIST_LAUNCH_IN_PLACE_TIMEOUT_MS: a
        # generation's group is built within it (the agent restarts the group past it), read when
        # the group is made (a warm zygote imports the module before the worker's environment).
        probe = "from dist_launch import elastic; print(elastic._Group().timeout.total_seconds())"
        for value, expected in (("2500", "2.5"), (None, "300.0"), ("soon", "300.0")):
            extra = {"DIST_LAUNCH_IN_PLACE_TIMEOUT_MS": value} if value is not None else {}
            env = worker_env(1, "timeout", 0, 1, **extra)
            if value is None:
                env.pop("DIST_LAUNCH_IN_PLACE_TIMEOUT_MS", None)
            out = subprocess.run([ARGS.python, "-c", probe], env=env, capture_output=True,
                                 text=True, timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertEqual(out.stdout.strip(), expected, f"{value}: {out.stderr}")


class Exit(unittest.TestCase):
    def test_a_watcher_woken_while_the_worker_exits_does_not_abort_it(self):
        # A daemon thread that wakes in torch's C++ once the interpreter is finalizing is ended by
        # pthread_exit, which aborts the process (SIGABRT after the last step, seen in CI): the
        # generation watcher is stopped at exit. Its key is set at several moments around the
        # worker's exit; every one must leave the worker's exit code 0 and say nothing more.
        port = start_store(self)
        for n, delay in enumerate((0.0, 0.01, 0.03, 0.06, 0.1, 0.2)):
            run_id = f"exit-{n}"
            worker = subprocess.Popen([ARGS.python, os.path.join(HERE, "exit_worker.py")],
                                      env=worker_env(port, run_id, 0, 1), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            self.assertEqual(worker.stdout.readline().strip(), "watching")
            worker.stdin.write("go\n")
            worker.stdin.flush()
            self.assertEqual(worker.stdout.readline().strip(), "leaving")
            time.sleep(delay)  # a moment of its exit, not an order: each must end the same
            publish_generation_1(port, run_id)
            out = worker.communicate(timeout=60)[0]
            self.assertEqual(worker.returncode, 0, f"key set {delay} s after it left: {out}")
            self.assertNotIn("terminate called", out)
            # Nor a warning with a C++ stack (torch's client says one when the connection it
            # waits on is shut down, as the watcher's is at every exit).
            self.assertNotIn("[c10d]", out)
            self.assertNotIn("Exception raised from", out)


def reap_together(agent, pids):
    """Holds the agent (SIGSTOP), SIGKILLs `pids` and waits until each can be reaped (a zombie
    whose threads have all exited), then continues it: its next reaping finds them all at once."""
    os.kill(agent, signal.SIGSTOP)
    try:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        for pid in pids:
            while time.monotonic() < deadline:
                with open(f"/proc/{pid}/stat") as f:
                    state = f.read().rsplit(")", 1)[1].split()[0]
                if state == "Z" and len(os.listdir(f"/proc/{pid}/task")) == 1:
                    break
                time.sleep(0.01)
            else:
                raise AssertionError(f"worker {pid} not reapable within 30 s")
    finally:
        os.kill(agent, signal.SIGCONT)


def read_until(proc, line):
    """proc's output up to and with this line (torch's warnings may come before it)."""
    seen = []
    for got in proc.stdout:
        seen.append(got)
        if got.strip() == line:
            return "".join(seen)
    raise AssertionError(f"no line {line!r}: {''.join(seen)}")


def queued_bytes(pid):
    """The bytes waiting in the send queues of pid's TCP sockets (/proc/net/tcp*)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    queued = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    queued += int(fields[4].split(":")[0], 16)
    return queued


class StuckSend(unittest.TestCase):
    def test_a_rank_whose_send_gloo_never_fails_leaves_instead_of_waiting_out_the_timeout(self):
        # Gloo fails a failed connection's pending operations, but not an unbound buffer's send
        # already queued for the socket: after the watcher shuts the group's connections down,
        # that send waits out the group's timeout (120 s here; 5 minutes by default), and so
        # does DDP's backward around it (seen 1 run in about 20 of a join). The rank leaves
        # instead, idle for DIST_LAUNCH_STUCK_COLLECTIVE_S, and says why in its error file.
        port = start_store(self)
        run_id = "stuck-send"
        error_file = os.path.join(self.tmp(), "error.json")
        script = os.path.join(HERE, "stuck_send_worker.py")
        ranks = []
        for rank in range(2):
            extra = {"DIST_LAUNCH_STUCK_COLLECTIVE_S": "2"}
            if rank == 1:
                extra["TORCHELASTIC_ERROR_FILE"] = error_file
            proc = subprocess.Popen([ARGS.python, script], env=worker_env(port, run_id, rank, 2,
                                                                          **extra),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            self.addCleanup(proc.wait)
            self.addCleanup(proc.kill)
            self.addCleanup(proc.stdout.close)
            self.addCleanup(proc.stdin.close)
            ranks.append(proc)
        receiver, sender = ranks
        said = read_until(sender, "ready") + read_until(receiver, "receiving")
        receiver.send_signal(signal.SIGSTOP)  # it reads no more
        sender.stdin.write("go\n")
        sender.stdin.flush()
        said += read_until(sender, "sending")
        deadline = time.monotonic() + 60
        while queued_bytes(sender.pid) == 0:  # the send under way: the sockets' buffers fill
            self.assertLess(time.monotonic(), deadline, "the send never began")
            time.sleep(0.01)
        published = time.monotonic()
        publish_generation_1(port, run_id)
        out = said + sender.communicate(timeout=100)[0]
        took = time.monotonic() - published
        self.assertEqual(sender.returncode, 75, out)
        self.assertIn("stayed in a collective of the failed group, idle, 2 s after generation 1 "
                      "was published", out)
        self.assertIn("dist.send(tensor, dst=0)", out)  # where its main thread was
        self.assertLess(took, 60, f"left {took:.1f} s after the publication, not about 2 s")
        with open(error_file) as f:
            message = json.load(f)["message"]
        self.assertIn("stayed in a collective", message["message"])
        self.assertIn("stuck_send_worker.py", message["extraInfo"]["py_callstack"])

    def tmp(self):
        import tempfile
        d = tempfile.mkdtemp(prefix="dist-stuck-send-")
        self.addCleanup(shutil.rmtree, d, ignore_errors=True)
        return d


if __name__ == "__main__":
    launcher_test_main.main(sys.modules[__name__])
