"""Differential test: the same raw TCPStore requests, op by op, against PyTorch's own server and
against dist-rendezvous; every reply must be the same bytes (or the same closed connection).

The interpreter's torch decides the dialect: torch 1.x speaks the legacy one (Debian's 1.13 at
/usr/bin/python3), torch 2.x the current one (its libuv server).
    /usr/bin/python3 store_diff_test.py --rendezvous build/bin/dist-rendezvous --require-major 1
    python3          store_diff_test.py --rendezvous build/bin/dist-rendezvous --require-major 2
Exits 77 (ctest's skip code) when this interpreter has no torch of that major version.

Where dist-rendezvous deliberately differs, the step says so (DEVIATIONS) and checks our reply.
"""
import argparse
import os
import re
import select
import socket
import struct
import subprocess
import sys
import unittest

SKIP = 77
try:
    import torch
except ImportError:
    print(f"SKIP: {sys.executable} has no torch (scripts/install-torch2.sh installs torch 2.x)")
    sys.exit(SKIP)

RENDEZVOUS = None
LEGACY = int(torch.__version__.split(".")[0]) < 2
REPLY_TIMEOUT_S = 10.0
SILENCE_S = 0.2  # how long a pending wait must stay unanswered

# Query numbers of the two dialects (tcpstore-protocol.md).
OPS = ({"SET": 0, "COMPARE_SET": 1, "GET": 2, "ADD": 3, "CHECK": 4, "WAIT": 5, "GETNUMKEYS": 6,
        "WATCH_KEY": 7, "DELETE_KEY": 8} if LEGACY else
       {"SET": 1, "COMPARE_SET": 2, "GET": 3, "ADD": 4, "CHECK": 5, "WAIT": 6, "GETNUMKEYS": 7,
        "DELETE_KEY": 8, "APPEND": 9, "MULTI_GET": 10, "MULTI_SET": 11, "CANCEL_WAIT": 12,
        "PING": 13, "QUEUE_PUSH": 14, "QUEUE_POP": 15, "QUEUE_LEN": 16, "LIST_KEYS": 17,
        "BARRIER": 18})
VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)

TORCH_SERVER = r"""
import datetime, sys, torch.distributed as dist
stores = []
for _ in sys.stdin:  # one new store per line read, its port printed
    stores.append(dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                timeout=datetime.timedelta(seconds=60)))
    print(stores[-1].port, flush=True)
"""


def s(b):
    b = b.encode() if isinstance(b, str) else b
    return struct.pack("<Q", len(b)) + b


def keys(*ks):
    return struct.pack("<Q", len(ks)) + b"".join(s(k) for k in ks)


def i64(v):
    return struct.pack("<q", v)


def req(op, *args):
    return bytes([OPS[op]]) + b"".join(args)


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not LEGACY:
            self.sock.sendall(VALIDATE)
        self.buf = b""
        self.eof = False

    def _fill(self, timeout):
        if self.eof or not select.select([self.sock], [], [], timeout)[0]:
            return False
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def take(self, n):
        while len(self.buf) < n:
            if not self._fill(REPLY_TIMEOUT_S):
                raise EOFError("closed" if self.eof else "no reply")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def string(self):
        n = self.take(8)
        return n + self.take(struct.unpack("<Q", n)[0])

    def reply(self, kind):
        """The reply's bytes, "CLOSED", "SILENT" (nothing within SILENCE_S) or "NO REPLY"."""
        try:
            if kind == "none":
                return b""
            if kind == "silent":
                return "SILENT" if not self.buf and not self._fill(SILENCE_S) else self.buf
            if kind == "closed":
                while self._fill(REPLY_TIMEOUT_S):
                    pass
                return "CLOSED" if self.eof else "OPEN"
            if kind in ("u8", "u32", "i64"):
                return self.take({"u8": 1, "u32": 4, "i64": 8}[kind])
            if kind == "bytes":
                return self.string()
            if kind.startswith("strings:"):
                return b"".join(self.string() for _ in range(int(kind[8:])))
            if kind == "watch":  # event type, key, old value, new value
                return self.take(1) + self.string() + self.string() + self.string()
            if kind == "pop":  # length, then the value when there is one
                n = self.take(8)
                return n + (self.string() if struct.unpack("<q", n)[0] > 0 else b"")
            if kind == "list":  # count, then the keys, compared as a set
                n = struct.unpack("<q", self.take(8))[0]
                return b"".join(sorted(self.string() for _ in range(n)))
        except EOFError as e:
            return "CLOSED" if str(e) == "closed" else "NO REPLY"
        raise ValueError(kind)

    def close(self):
        self.sock.close()


class Servers:
    """PyTorch's own server (one process, a new store per scenario) and dist-rendezvous."""

    def __init__(self):
        self.torch = subprocess.Popen([sys.executable, "-c", TORCH_SERVER], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
        self.ours = None

    def fresh(self):
        """Ports of a new, empty store of each kind."""
        self.torch.stdin.write("new\n")
        self.torch.stdin.flush()
        torch_port = int(self.torch.stdout.readline())
        self.stop_ours()
        self.ours = subprocess.Popen([RENDEZVOUS, "--host", "127.0.0.1", "--port", "0",
                                      "--log-level", "off"], stdout=subprocess.PIPE, text=True)
        match = re.search(r"listening on 127\.0\.0\.1:(\d+)", self.ours.stdout.readline())
        if not match:
            raise RuntimeError("dist-rendezvous did not start")
        return torch_port, int(match.group(1))

    def stop_ours(self):
        if self.ours:
            self.ours.terminate()
            self.ours.wait(timeout=10)
            self.ours.stdout.close()
            self.ours = None

    def stop(self):
        self.stop_ours()
        self.torch.stdin.close()
        try:
            self.torch.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.torch.kill()
            self.torch.wait()
        self.torch.stdout.close()


# A scenario is a list of steps (connection name, request bytes or None, reply kind[, ours]):
# None reads a reply the connection is owed (a released wait, a watch event). `ours`, when
# given, is a deliberate deviation: dist-rendezvous must answer that, whatever torch answers.
STOP = b"\x00"
ODD_COUNTERS = [" 12", "12abc", "+5", "\t\n12", "0x10", "1e3", " -7 ", "12\x00zz", "-0"]
CLOSING_COUNTERS = ["", "abc", "- 5", "99999999999999999999", "+-1"]


def common_scenarios():
    sc = {
        "set, get, overwrite, empty value and empty key": [
            ("a", req("SET", s("/k"), s("v1")), "none"),
            ("a", req("GET", s("/k")), "bytes"),
            ("a", req("SET", s("/k"), s(b"\x00\xffbin")), "none"),
            ("a", req("GET", s("/k")), "bytes"),
            ("a", req("SET", s("/k"), s("")), "none"),
            ("a", req("GET", s("/k")), "bytes"),
            ("a", req("SET", s(""), s("empty key")), "none"),
            ("a", req("GET", s("")), "bytes"),
            ("a", req("GETNUMKEYS"), "i64"),
        ],
        "get of a missing key": [
            ("a", req("GET", s("/missing")), "closed" if LEGACY else "bytes"),
        ],
        "add counts from nothing, both signs": [
            ("a", req("ADD", s("/n"), i64(5)), "i64"),
            ("a", req("ADD", s("/n"), i64(-7)), "i64"),
            ("a", req("ADD", s("/n"), i64(0)), "i64"),
            ("a", req("GET", s("/n")), "bytes"),
            ("a", req("ADD", s("/max"), i64(2**63 - 1)), "i64"),
            ("a", req("ADD", s("/max"), i64(1)), "i64"),  # wraps
            ("a", req("GET", s("/max")), "bytes"),
            ("a", req("ADD", s("/min"), i64(-2**63)), "i64"),
            ("a", req("ADD", s("/min"), i64(-1)), "i64"),
        ],
        "add on stored text that std::stoll reads": [
            step for i, text in enumerate(ODD_COUNTERS) for step in [
                ("a", req("SET", s(f"/odd{i}"), s(text)), "none"),
                ("a", req("ADD", s(f"/odd{i}"), i64(1)), "i64"),
                ("a", req("GET", s(f"/odd{i}")), "bytes")]
        ],
        "compare_set, every case": [
            ("a", req("COMPARE_SET", s("/c"), s(""), s("first")), "bytes"),
            ("a", req("COMPARE_SET", s("/c"), s("wrong"), s("second")), "bytes"),
            ("a", req("COMPARE_SET", s("/c"), s("first"), s("second")), "bytes"),
            ("a", req("COMPARE_SET", s("/c"), s("second"), s("")), "bytes"),
            ("a", req("GET", s("/c")), "bytes"),
            ("a", req("COMPARE_SET", s("/none"), s("expected"), s("x")), "bytes"),
            ("a", req("CHECK", keys("/none")), "u8"),
        ],
        "check": [
            ("a", req("SET", s("/x"), s("1")), "none"),
            ("a", req("CHECK", keys("/x")), "u8"),
            ("a", req("CHECK", keys("/x", "/y")), "u8"),
            ("a", req("CHECK", keys()), "u8"),
        ],
        "wait: present, missing then set, two keys, duplicates, none": [
            ("a", req("SET", s("/here"), s("1")), "none"),
            ("a", req("WAIT", keys("/here")), "u8"),
            ("a", req("WAIT", keys()), "u8"),
            ("w", req("WAIT", keys("/k1", "/k2", "/here")), "silent"),
            ("b", req("SET", s("/k1"), s("v")), "none"),
            ("b", req("SET", s("/k1"), s("again")), "none"),
            ("w", None, "silent"),
            ("b", req("ADD", s("/k2"), i64(1)), "i64"),
            ("w", None, "u8"),
            ("d", req("WAIT", keys("/dup", "/dup")), "silent"),
            ("b", req("SET", s("/dup"), s("v")), "none"),
            ("d", None, "u8"),
        ],
        "wait released by compare_set creating the key": [
            ("w", req("WAIT", keys("/cas")), "silent"),
            ("b", req("COMPARE_SET", s("/cas"), s(""), s("v")), "bytes"),
            # torch 1.13's server forgets to wake waiters here; a waiting worker would hang.
            ("w", None, "u8" if not LEGACY else "silent", STOP if LEGACY else None),
        ],
        "delete_key and num_keys": [
            ("a", req("SET", s("/d1"), s("1")), "none"),
            ("a", req("SET", s("/d2"), s("2")), "none"),
            ("a", req("GETNUMKEYS"), "i64"),
            ("a", req("DELETE_KEY", s("/d1")), "i64"),
            ("a", req("DELETE_KEY", s("/d1")), "i64"),
            ("a", req("DELETE_KEY", s("/never")), "i64"),
            ("a", req("GETNUMKEYS"), "i64"),
            ("a", req("CHECK", keys("/d1")), "u8"),
        ],
        "unknown query type": [
            ("a", bytes([0x7F]), "closed"),
        ],
    }
    for i, text in enumerate(CLOSING_COUNTERS):
        sc[f"add on stored text with no number: {text!r}"] = [
            ("a", req("SET", s("/bad"), s(text)), "none"),
            ("a", req("ADD", s("/bad"), i64(1)), "closed"),
            ("b", req("GET", s("/bad")), "bytes"),
        ]
    return sc


def legacy_scenarios():
    return {
        "watch_key: created, updated, compare_set, add, deleted": [
            ("w", req("WATCH_KEY", s("/wk")), "u8"),
            ("b", req("SET", s("/wk"), s("one")), "none"),
            ("w", None, "watch"),
            ("b", req("SET", s("/wk"), s("two")), "none"),
            ("w", None, "watch"),
            ("b", req("COMPARE_SET", s("/wk"), s("two"), s("three")), "bytes"),
            ("w", None, "watch"),
            ("b", req("DELETE_KEY", s("/wk")), "i64"),
            ("w", None, "watch"),
            ("b", req("ADD", s("/wk"), i64(4)), "i64"),
            ("w", None, "watch"),
        ],
    }


def current_scenarios():
    return {
        "append": [
            ("a", req("APPEND", s("/ap"), s("x")), "none"),
            ("a", req("APPEND", s("/ap"), s("yz")), "none"),
            ("a", req("APPEND", s("/ap"), s("")), "none"),
            ("a", req("GET", s("/ap")), "bytes"),
        ],
        "multi_set and multi_get, with a missing key": [
            ("a", req("MULTI_SET", struct.pack("<Q", 3), s("/m1"), s("1"), s("/m2"), s(""),
                      s("/m1"), s("again")), "none"),
            ("a", req("MULTI_GET", keys("/m1", "/m2")), "strings:2"),
            ("a", req("MULTI_GET", keys("/m2", "/m-missing")), "strings:2"),
            ("a", req("MULTI_GET", keys()), "strings:0"),
            ("a", req("GETNUMKEYS"), "i64"),
        ],
        "cancel_wait with and without a wait": [
            ("a", req("CANCEL_WAIT"), "u8"),
            ("w", req("WAIT", keys("/cw")), "silent"),
            ("w", req("CANCEL_WAIT"), "u8"),
            ("b", req("SET", s("/cw"), s("1")), "none"),
            ("w", None, "silent"),
            ("w", req("WAIT", keys("/cw")), "u8"),
        ],
        "ping": [
            ("a", req("PING", struct.pack("<I", 4242)), "u32"),
            ("a", req("PING", struct.pack("<I", 0xFFFFFFFF)), "u32"),
        ],
        "queues": [
            ("a", req("QUEUE_LEN", s("/q")), "i64"),
            ("a", req("QUEUE_POP", s("/q")), "pop"),
            ("a", req("QUEUE_PUSH", s("/q"), s("one")), "none"),
            ("a", req("QUEUE_PUSH", s("/q"), s("")), "none"),
            ("a", req("QUEUE_LEN", s("/q")), "i64"),
            ("a", req("QUEUE_POP", s("/q")), "pop"),
            ("a", req("QUEUE_POP", s("/q")), "pop"),
            ("a", req("QUEUE_LEN", s("/q")), "i64"),
        ],
        "a wait on a queue is released by a push": [
            ("w", req("WAIT", keys("/wq")), "silent"),
            ("b", req("QUEUE_PUSH", s("/wq"), s("item")), "none"),
            ("w", None, "u8"),
        ],
        "list_keys": [
            ("a", req("LIST_KEYS"), "list"),
            ("a", req("SET", s("/l2"), s("1")), "none"),
            ("a", req("SET", s("/l1"), s("1")), "none"),
            ("a", req("ADD", s("/l3"), i64(1)), "i64"),
            ("a", req("LIST_KEYS"), "list"),
        ],
        "barrier": [
            ("a", req("BARRIER", s("/bar"), i64(1)), "u8"),
            ("a", req("GET", s("/bar")), "bytes"),
            ("x", req("BARRIER", s("/bar2"), i64(2)), "silent"),
            ("y", req("BARRIER", s("/bar2"), i64(2)), "u8"),
            ("x", None, "u8"),
        ],
    }


class Differential(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.servers = Servers()

    @classmethod
    def tearDownClass(cls):
        cls.servers.stop()

    def run_scenario(self, name, steps):
        torch_port, our_port = self.servers.fresh()
        conns = {}
        try:
            for number, step in enumerate(steps):
                who, request, kind = step[:3]
                deviation = step[3] if len(step) > 3 else None
                for server, port in (("torch", torch_port), ("ours", our_port)):
                    if (server, who) not in conns:
                        conns[(server, who)] = Conn(port)
                    if request is not None:
                        conns[(server, who)].sock.sendall(request)
                theirs = conns[("torch", who)].reply(kind)
                ours = conns[("ours", who)].reply("u8" if deviation else kind)
                what = f"{name}, step {number} ({who}: {request!r} -> {kind})"
                if deviation is not None:
                    self.assertEqual(ours, deviation, f"{what}: our documented deviation")
                    print(f"  deviation in {what}: torch {theirs!r}, ours {ours!r}")
                else:
                    self.assertEqual(ours, theirs, what)
        finally:
            for c in conns.values():
                c.close()

    def test_every_scenario(self):
        scenarios = dict(common_scenarios())
        scenarios.update(legacy_scenarios() if LEGACY else current_scenarios())
        for name, steps in scenarios.items():
            with self.subTest(name):
                self.run_scenario(name, steps)
        print(f"{len(scenarios)} scenarios, "
              f"{sum(len(s) for s in scenarios.values())} steps compared", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rendezvous", required=True)
    parser.add_argument("--require-major", type=int, default=None,
                        help="skip unless torch has this major version")
    args, rest = parser.parse_known_args()
    major = int(torch.__version__.split(".")[0])
    if args.require_major is not None and major != args.require_major:
        print(f"SKIP: {sys.executable} has torch {torch.__version__}, not {args.require_major}.x")
        sys.exit(SKIP)
    RENDEZVOUS = os.path.abspath(args.rendezvous)
    print(f"torch {torch.__version__} at {sys.executable} "
          f"({'legacy' if LEGACY else 'current'} dialect)", flush=True)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
