"""Which threads of a torch worker dist-launch's progress sampler takes as able to issue a
collective beside a blocked main thread (python/dist_launch/progress.py, others_may_issue): then
the main thread's wait proves nothing to the agent. Real threads of the kinds torch jobs have:
the script's own, a Timer, a sched scheduler, an executor's worker running a task of the
script's, and not a queue's feeder thread (a DataLoader's), an idle
executor worker (torch.compile leaves one for the process's life), a known library's monitor
(tqdm's) or nothing; any other library's thread is taken as able (a package the script is).

    python3 progress_threads_test.py   (exits 77, skip, without torch)
"""
import concurrent.futures
import importlib.util
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRESS = os.path.join(HERE, "..", "..", "python", "dist_launch", "progress.py")

try:
    import torch
except ImportError:
    print("no torch here: skipped", file=sys.stderr)
    sys.exit(77)


def eventually(condition, timeout=30):
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def walk(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def load_sampler():
    spec = importlib.util.spec_from_file_location("progress_under_test", PROGRESS)
    progress = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(progress)
    area = mmap.mmap(-1, 4096)
    return progress._Sampler(torch, memoryview(area).cast("Q"), memoryview(area).cast("I"))


class OthersMayIssue(unittest.TestCase):
    def setUp(self):
        self.sampler = load_sampler()
        self.release = threading.Event()
        self.started = threading.Event()
        self.addCleanup(self.release.set)

    def may_issue(self):
        return self.sampler.others_may_issue(sys._current_frames())

    def waits(self):  # a function of the script's own (this file is not in site-packages)
        self.started.set()
        self.release.wait(60)

    def test_no_other_thread(self):
        self.assertFalse(self.may_issue())

    def test_a_thread_of_the_scripts_own(self):
        thread = threading.Thread(target=self.waits, daemon=True)
        thread.start()
        self.assertTrue(self.started.wait(30))
        self.assertTrue(self.may_issue())
        self.release.set()
        thread.join(30)
        self.assertFalse(self.may_issue())

    def test_an_idle_executor_worker_is_not_but_one_running_a_task_of_the_scripts_is(self):
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pool.submit(int).result(30)
            self.assertFalse(self.may_issue())
            task = pool.submit(self.waits)
            self.assertTrue(self.started.wait(30))
            self.assertTrue(self.may_issue())
            self.release.set()
            task.result(30)

    def test_a_timer_waiting_to_run_a_callable(self):
        timer = threading.Timer(600, int)
        timer.start()
        try:
            self.assertTrue(self.may_issue())
        finally:
            timer.cancel()
            timer.join(30)

    def test_a_scheduler_of_the_standard_library_with_an_event_to_run(self):
        # The standard library's frames alone: sched.scheduler.run, then Event.wait.
        import sched

        scheduler = sched.scheduler(time.monotonic, self.release.wait)
        event = scheduler.enter(600, 1, int)
        thread = threading.Thread(target=scheduler.run, daemon=True)
        thread.start()
        self.addCleanup(thread.join, 30)
        self.addCleanup(self.release.set)
        self.addCleanup(scheduler.cancel, event)

        def in_run():
            return any(f.f_code.co_name == "run" and f.f_code.co_filename.endswith("sched.py")
                       for f in walk(sys._current_frames().get(thread.ident)))

        self.assertTrue(eventually(in_run))
        self.assertTrue(self.may_issue())

    def test_a_queues_feeder_thread_is_not(self):
        # A DataLoader's worker queues each have one (multiprocessing.queues' _feed).
        import multiprocessing

        queue = multiprocessing.get_context("spawn").Queue()
        queue.put(1)
        self.addCleanup(queue.close)
        self.addCleanup(queue.cancel_join_thread)
        self.assertTrue(eventually(lambda: any(
            t.name.startswith("QueueFeederThread") for t in threading.enumerate())))
        self.assertFalse(self.may_issue())

    def test_a_process_pools_manager_thread_is_not(self):
        # (torch.compile's pool on torch 2.1-2.2 is a ProcessPoolExecutor: it lives on.)
        import multiprocessing

        with concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn")) as pool:
            self.assertEqual(pool.submit(abs, -3).result(60), 3)
            self.assertTrue(eventually(lambda: any(
                type(t).__name__ == "_ExecutorManagerThread" for t in threading.enumerate())))
            self.assertFalse(self.may_issue())

    def library_thread(self, name):
        """A thread of a package `name` installed in a site-packages folder (made here), waiting."""
        folder = tempfile.mkdtemp(prefix="progress-threads-")
        self.addCleanup(shutil.rmtree, folder, True)
        package = os.path.join(folder, "lib", "site-packages", name)
        os.makedirs(package)
        with open(os.path.join(package, "__init__.py"), "w") as f:
            f.write("import threading\n"
                    "def monitor(started, release):\n"
                    "    started.set()\n"
                    "    release.wait(60)\n")
        spec = importlib.util.spec_from_file_location(name, os.path.join(package, "__init__.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        thread = threading.Thread(target=module.monitor, args=(self.started, self.release),
                                  daemon=True)
        thread.start()
        self.addCleanup(thread.join, 30)
        self.addCleanup(self.release.set)
        self.assertTrue(self.started.wait(30))

    def test_a_monitor_of_a_known_quiet_library_is_not(self):
        self.library_thread("tqdm")
        self.assertFalse(self.may_issue())

    def test_a_thread_of_any_other_library_is(self):
        self.library_thread("mytrainer")  # a package the script is, or a framework's
        self.assertTrue(self.may_issue())


if __name__ == "__main__":
    unittest.main()
