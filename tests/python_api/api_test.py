"""The Python API from a source checkout (python/ on PYTHONPATH, the built programs on PATH), with
a Python function as the entrypoint, as torch's elastic_launch(config, fn)(*args) takes one: return
values by global rank, a failure's message and error file, restarts, a function in __main__, and
what cannot be sent to a fresh interpreter. No torch needed.

    python3 api_test.py --bin-dir build/bin
"""
import argparse
import os
import pickle
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "python"))

import dist_launch  # noqa: E402
from dist_launch import (ChildFailedError, LaunchConfig, elastic_launch, launch,  # noqa: E402
                         run)

JOB_TIMEOUT_S = 120


# The launched functions: at this module's top level, so that a fresh interpreter imports them
# (this file is __main__ here, re-imported there as __mp_main__, as multiprocessing's spawn does).
def rank_plus(base):
    return {"value": base + int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"])}


def sad():
    raise RuntimeError("sad because i throw")


def huge():
    raise RuntimeError("x" * (1 << 20))


def flaky(marker_dir):
    """Fails on rank 1 of the first attempt; returns the attempt on every rank after that."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and os.environ["RANK"] == "1":
        raise ValueError("rank 1 fails once")
    open(os.path.join(marker_dir, f"{attempt}_{os.environ['RANK']}"), "w").close()
    return attempt


def working_directory():
    return os.getcwd()


def exits_zero():
    sys.exit(0)


def returns_a_lock():
    import threading
    return threading.Lock()


def interrupted():
    raise KeyboardInterrupt()


def launch_sad(_):
    """In a process pool's process: the ChildFailedError goes back to the caller pickled."""
    return launch(LaunchConfig(nproc_per_node=1), sad)


class FunctionEntrypoint(unittest.TestCase):
    def test_return_values_by_global_rank(self):
        results = elastic_launch(LaunchConfig(nproc_per_node=3), rank_plus)(10)
        self.assertEqual({0: {"value": 10, "world": 3}, 1: {"value": 11, "world": 3},
                          2: {"value": 12, "world": 3}}, results)

    def test_a_raising_function_is_the_root_cause_with_its_message_and_error_file(self):
        with self.assertRaises(ChildFailedError) as caught:
            launch(LaunchConfig(nproc_per_node=2), sad)
        error = caught.exception
        rank, root = error.get_first_failure()
        self.assertIn(rank, {0, 1})
        # Both ranks raise: the one whose error came first may have been stopped by the other's
        # failure after it wrote its error file, before its exit (SIGTERM then ended it; the
        # report says so), as happened once on a loaded machine.
        self.assertIn(root.exitcode, {1, -signal.SIGTERM})
        self.assertEqual("sad", error.name)
        # dist-launch's own report names the function, not the script that runs it
        self.assertIn("sad FAILED", error.format_msg())
        self.assertNotIn("_function_worker.py FAILED", error.format_msg())
        self.assertEqual("RuntimeError: sad because i throw", root.message)
        data = root.error_file_data["message"]
        self.assertEqual(root.message, data["message"])
        self.assertIn("in sad", data["extraInfo"]["py_callstack"])
        self.assertEqual(int(data["extraInfo"]["timestamp"]), root.timestamp)
        self.assertLessEqual(set(error.failures), {0, 1})  # the other may be stopped first

    def test_a_huge_message_is_whole_in_the_error_though_the_report_shows_it_cut(self):
        with self.assertRaises(ChildFailedError) as caught:
            launch(LaunchConfig(nproc_per_node=1), huge)
        _, root = caught.exception.get_first_failure()
        self.assertEqual("RuntimeError: " + "x" * (1 << 20), root.message)
        self.assertIn("bytes: whole in the traceback)", caught.exception.format_msg())

    def test_restarted_workers_return_the_last_attempts_values(self):
        with tempfile.TemporaryDirectory() as markers:
            results = launch(LaunchConfig(nproc_per_node=2, max_restarts=1), flaky, markers)
            self.assertEqual({0: 1, 1: 1}, results)
            # <attempt>_<rank>: rank 0's first attempt may be stopped before it marks
            ran = set(os.listdir(markers))
            self.assertLessEqual({"1_0", "1_1"}, ran)
            self.assertNotIn("0_1", ran)

    def test_workers_start_in_the_callers_working_directory(self):
        with tempfile.TemporaryDirectory() as where:
            before = os.getcwd()
            os.chdir(where)
            try:
                results = launch(LaunchConfig(nproc_per_node=1), working_directory)
            finally:
                os.chdir(before)
            self.assertEqual({0: os.path.realpath(where)}, {
                r: os.path.realpath(v) for r, v in results.items()})

    def test_a_lambda_is_refused_before_anything_starts(self):
        with self.assertRaisesRegex(TypeError, "define the function at a module's top level"):
            launch(LaunchConfig(nproc_per_node=1), lambda: 1)

    def root_cause_of_driver(self, source):
        """Runs `source` as a script of its own (its own __main__), which prints "MESSAGE" and
        the root cause's message of the ChildFailedError it catches; returns that message."""
        with tempfile.TemporaryDirectory() as where:
            driver = os.path.join(where, "driver.py")
            with open(driver, "w") as f:
                f.write(textwrap.dedent(source))
            proc = subprocess.run([sys.executable, driver], capture_output=True, text=True,
                                  timeout=JOB_TIMEOUT_S, cwd=where)
        self.assertEqual(0, proc.returncode, proc.stderr)
        message = [line for line in proc.stdout.splitlines() if line.startswith("MESSAGE")]
        self.assertEqual(1, len(message), proc.stdout + proc.stderr)
        return message[0]

    def test_a_function_hidden_under_main_fails_with_the_reason(self):
        message = self.root_cause_of_driver("""\
            from dist_launch import ChildFailedError, LaunchConfig, launch
            if __name__ == "__main__":
                def hidden():
                    return 1
                try:
                    launch(LaunchConfig(nproc_per_node=1), hidden)
                except ChildFailedError as e:
                    print("MESSAGE", e.get_first_failure()[1].message)
        """)
        self.assertIn("cannot load the launched function here", message)
        self.assertIn("hidden", message)

    def test_a_launch_at_the_top_level_of_main_is_refused_in_the_workers(self):
        """The workers re-import __main__ (as spawn does): an unguarded launch there must fail
        with the reason, not launch again from every worker."""
        message = self.root_cause_of_driver("""\
            import os
            from dist_launch import ChildFailedError, LaunchConfig, launch
            def rank():
                return os.environ["RANK"]
            try:
                launch(LaunchConfig(nproc_per_node=2), rank)
            except ChildFailedError as e:
                print("MESSAGE", e.get_first_failure()[1].message)
        """)
        self.assertIn("launch from under `if __name__ == \"__main__\":`", message)

    def test_a_workers_prompt_is_shown_and_answered_through_the_callers_stdin(self):
        # As under torchrun: the worker's stdin is the caller's, and its prompt (no newline after
        # it) reaches the caller's stdout before it is answered.
        where = tempfile.mkdtemp(prefix="dist-api-prompt-")
        self.addCleanup(__import__("shutil").rmtree, where, True)
        driver = os.path.join(where, "driver.py")
        with open(driver, "w") as f:
            f.write(textwrap.dedent("""\
                import sys
                from dist_launch import LaunchConfig, launch
                if __name__ == "__main__":
                    code = "print('got', input('x? '))"
                    print("RESULT", launch(LaunchConfig(nproc_per_node=1), sys.executable, "-c",
                                           code), flush=True)
            """))
        proc = subprocess.Popen([sys.executable, driver], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=where)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.wait()))
        seen = b""
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while b"x? " not in seen and time.monotonic() < deadline:
            if select.select([proc.stdout], [], [], 0.5)[0]:
                data = os.read(proc.stdout.fileno(), 65536)
                if not data:
                    break
                seen += data
        self.assertIn(b"x? ", seen, "the prompt never came")
        proc.stdin.write(b"7\n")
        proc.stdin.close()
        rest = proc.stdout.read()
        self.assertEqual(proc.wait(timeout=JOB_TIMEOUT_S), 0, (seen + rest).decode())
        self.assertIn(b"got 7", seen + rest)
        self.assertIn(b"RESULT {0: 0}", seen + rest)

    def test_a_function_that_exits_zero_returned_none(self):
        # (as torch's elastic_launch: {rank: None}; it returned {})
        self.assertEqual({0: None, 1: None}, launch(LaunchConfig(nproc_per_node=2), exits_zero))

    def test_a_return_value_that_cannot_be_sent_back_is_the_message(self):
        # (the message was empty: the cause only on the worker's stderr)
        with self.assertRaises(ChildFailedError) as caught:
            launch(LaunchConfig(nproc_per_node=1), returns_a_lock)
        self.assertRegex(caught.exception.get_first_failure()[1].message,
                         r"^the function's return value cannot be sent back: TypeError: "
                         r"cannot pickle '_thread.lock' object")

    def test_the_errors_pickle_whole_as_a_process_pool_sends_them(self):
        # (a failed launch in a ProcessPoolExecutor broke the pool: the error could not be
        # rebuilt, "missing 4 required positional arguments")
        import concurrent.futures
        import multiprocessing
        import pickle
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
            with self.assertRaises(ChildFailedError) as caught:
                pool.submit(launch_sad, 0).result(timeout=JOB_TIMEOUT_S)
        error = caught.exception
        self.assertEqual("RuntimeError: sad because i throw", error.get_first_failure()[1].message)
        self.assertIn("sad FAILED", error.format_msg())
        for made in (dist_launch.LaunchError("x", 3), dist_launch.UsageError("bad", 2),
                     dist_launch.SignalException("stopped", 130, 2)):
            back = pickle.loads(pickle.dumps(made))
            self.assertEqual((type(back), str(back), back.exit_code),
                             (type(made), str(made), made.exit_code))
        self.assertEqual(pickle.loads(pickle.dumps(dist_launch.SignalException("s", 130, 2))).sigval,
                         2)

    def test_a_launch_from_another_thread_says_signals_do_not_reach_the_job(self):
        # (nothing said it, where torch's elastic_launch warns) and the job runs to its end
        source = textwrap.dedent("""\
            import concurrent.futures, sys
            from dist_launch import LaunchConfig, launch
            if __name__ == "__main__":
                pool = concurrent.futures.ThreadPoolExecutor(1)
                done = pool.submit(launch, LaunchConfig(nproc_per_node=1), sys.executable, "-c",
                                   "import time; time.sleep(1)")
                print("RESULT", done.result(), flush=True)
        """)
        with tempfile.TemporaryDirectory() as where:
            driver = os.path.join(where, "driver.py")
            with open(driver, "w") as f:
                f.write(source)
            proc = subprocess.run([sys.executable, driver], capture_output=True, text=True,
                                  timeout=JOB_TIMEOUT_S, cwd=where)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("RESULT {0: 0}", proc.stdout)
        self.assertIn("a signal this process receives is not passed on to the job", proc.stderr)

    def test_a_closed_stdout_is_no_error(self):
        # (flushing Python's stdout, None when the process started without one, raised)
        code = ("import sys\nfrom dist_launch import LaunchConfig, launch\n"
                "sys.stderr.write(repr(launch(LaunchConfig(nproc_per_node=1), sys.executable, "
                "'-c', 'print(1)')))\n")
        proc = subprocess.run(f"{sys.executable} -c \"$CODE\" >&-", shell=True,
                              env=dict(os.environ, CODE=code), capture_output=True, text=True,
                              timeout=JOB_TIMEOUT_S)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("{0: 0}", proc.stderr)

    def test_an_exception_without_a_message_is_its_name(self):
        with self.assertRaises(ChildFailedError) as caught:
            launch(LaunchConfig(nproc_per_node=1), interrupted)
        self.assertEqual("KeyboardInterrupt", caught.exception.get_first_failure()[1].message)

    def test_a_config_of_another_kind_is_refused_saying_which(self):
        # (torch's LaunchConfig gave "'LaunchConfig' object has no attribute 'python'")
        class LaunchConfig:  # noqa: N801 (what torch's is called)
            nproc_per_node = 1
        with self.assertRaisesRegex(TypeError, r"config is a __main__\..*LaunchConfig: "
                                    r"dist-launch takes dist_launch.LaunchConfig"):
            launch(LaunchConfig(), sys.executable, "-c", "pass")

    def test_an_entrypoint_or_command_line_of_another_type_is_refused_saying_what_it_takes(self):
        with self.assertRaisesRegex(TypeError, r"^entrypoint is of type int: dist-launch takes a "
                                    r"script or program \(a str or path\) or a function"):
            elastic_launch(LaunchConfig(nproc_per_node=1), 42)()
        with self.assertRaisesRegex(TypeError, r"^run\(\) takes the command line as a list of "
                                    r"strings"):
            run("--nproc-per-node 2 train.py")

    def test_torchs_other_fields_are_taken_as_its_callers_pass_them(self):
        # (They were a TypeError: "unexpected keyword argument 'log_line_prefix_template'".)
        with tempfile.TemporaryDirectory() as logs:
            config = LaunchConfig(nproc_per_node=2, log_line_prefix_template="<${rank}> ",
                                  duplicate_stdout_filters=["needle, with a comma"],
                                  event_log_handler="null", metrics_cfg={"unused": "1"})
            try:  # torch's DefaultLogsSpecs where torch is, else the same fields of ours
                from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
                config.logs_specs = DefaultLogsSpecs(log_dir=logs, tee=Std.ALL)
            except ImportError:
                config.log_dir, config.tee = logs, 3
            results = launch(config, sys.executable, "-c",
                             "print('a needle, with a comma, in a haystack')")
            self.assertEqual({0: 0, 1: 0}, results)
            found = {}
            for directory, _, files in os.walk(logs):
                for name in files:
                    with open(os.path.join(directory, name)) as f:
                        found.setdefault(name, []).append(f.read())
            self.assertEqual(2, len(found.get("stdout.log", [])), found)
            for text in found["stdout.log"]:
                self.assertIn("a needle, with a comma, in a haystack", text)
            filtered = "".join(found.get("filtered_stdout.log", []))
            for rank in (0, 1):
                self.assertIn(f"<{rank}> a needle, with a comma, in a haystack", filtered)
        with self.assertRaisesRegex(dist_launch.UsageError, "logs_specs of type object: "
                                    "dist-launch takes torch's DefaultLogsSpecs"):
            launch(LaunchConfig(nproc_per_node=1, logs_specs=object()), sys.executable, "-c", "")

    def test_torchs_except_child_failed_error_catches_the_failure(self):
        try:
            from torch.distributed.elastic.multiprocessing.errors import \
                ChildFailedError as TorchsChildFailedError
        except ImportError:
            self.skipTest("no torch 2.x here (torch.distributed.elastic's errors)")
        with self.assertRaises(TorchsChildFailedError) as caught:
            launch(LaunchConfig(nproc_per_node=1), sad)
        error = caught.exception
        self.assertIsInstance(error, ChildFailedError)
        rank, first = error.get_first_failure()
        self.assertEqual((0, 1), (rank, first.exitcode))
        self.assertIn("sad because i throw", first.message)
        self.assertIn("sad FAILED", error.format_msg())
        again = pickle.loads(pickle.dumps(error))  # torch's too where it lands with torch's loaded
        self.assertIsInstance(again, TorchsChildFailedError)
        self.assertIsInstance(again, ChildFailedError)
        self.assertEqual(str(error), str(again))

    def test_torchs_record_passes_the_failure_on(self):
        # torch's @record copies the root cause's error file when it catches its ChildFailedError;
        # the failure's file must be one it can read or "<N/A>", never "" (open('') failed and a
        # FileNotFoundError hid the failure).
        try:
            from torch.distributed.elastic.multiprocessing.errors import record
        except ImportError:
            self.skipTest("no torch here")
        from dist_launch.errors import ProcessFailure
        with tempfile.TemporaryDirectory() as parent:
            parents_file = os.path.join(parent, "error.json")
            os.environ["TORCHELASTIC_ERROR_FILE"] = parents_file
            try:
                # No error file (a program's exit): the failure, not open('').
                with self.assertRaises(ChildFailedError):
                    record(lambda: launch(LaunchConfig(nproc_per_node=1), sys.executable, "-c",
                                          "raise SystemExit(3)"))()
                # The function's error file: copied into the parent's, as under torch.
                with self.assertRaises(ChildFailedError):
                    record(lambda: launch(LaunchConfig(nproc_per_node=1), sad))()
                with open(parents_file) as f:
                    self.assertIn("sad because i throw", f.read())
                # One cut short (its worker killed as it wrote it): the failure still.
                cut = os.path.join(parent, "cut.json")
                with open(cut, "w") as f:
                    f.write('{"message": {"message": "RuntimeE')
                failure = ProcessFailure(0, 0, "h", 1, 1, cut, "", "", 0)
                error = ChildFailedError.of("train.py", {0: failure}, 0, "report", 1)

                def raises():
                    raise error
                with self.assertRaises(ChildFailedError) as caught:
                    record(raises)()
                self.assertIs(caught.exception, error)
                self.assertEqual("<N/A>", error.get_first_failure()[1].error_file)
            finally:
                del os.environ["TORCHELASTIC_ERROR_FILE"]

    def test_programs_still_return_exit_codes(self):
        results = launch(LaunchConfig(nproc_per_node=2), sys.executable, "-c", "pass")
        self.assertEqual({0: 0, 1: 0}, results)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin-dir", required=True, help="where dist-launch was built")
    args, rest = parser.parse_known_args()
    os.environ["PATH"] = os.path.abspath(args.bin_dir) + os.pathsep + os.environ["PATH"]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(SOURCE, "python")] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    os.environ.pop("PYTHON_EXEC", None)  # the workers run on this interpreter
    print(f"api_test: dist-launch is {dist_launch.program('dist-launch')}", flush=True)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
