"""A client without the job's token, run on a named host to see what the store lets it do: each
step on a fresh connection, speaking PyTorch's wire protocol the way an unmodified worker does.

    python3 store_stranger.py HOST PORT STEP...
      legacy:add:KEY:N        legacy dialect (torch 1.x) ADD
      legacy:get:KEY          GET
      legacy:set:KEY:VALUE    SET, then GETNUMKEYS (SET itself has no reply)
      legacy:delete:KEY       DELETE_KEY
      legacy:numkeys          GETNUMKEYS
      current:delete_all_except:PREFIX   dist-launch's extension, after VALIDATE
      torch:add:KEY:N         through torch.distributed.TCPStore itself
      torch:get:KEY
Prints one JSON object per step: {"step": STEP, "result": VALUE} where VALUE is the reply (an
integer or a string) or "CLOSED" when the store closed the connection instead of answering.
"""
import datetime
import json
import select
import socket
import struct
import sys

REPLY_TIMEOUT_S = 10.0
LEGACY = {"set": 0, "get": 2, "add": 3, "numkeys": 6, "delete": 8}
VALIDATE = b"\x00" + struct.pack("<I", 0x3C85F7CE)
DELETE_ALL_EXCEPT = 0x84


class Closed(Exception):
    pass


def s(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


class Conn:
    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port), timeout=REPLY_TIMEOUT_S)
        self.buf = b""

    def send(self, data):
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            raise Closed()

    def take(self, n):
        while len(self.buf) < n:
            if not select.select([self.sock], [], [], REPLY_TIMEOUT_S)[0]:
                raise TimeoutError(f"no reply and no close within {REPLY_TIMEOUT_S} s")
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                raise Closed()
            self.buf += data
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def i64(self):
        return struct.unpack("<q", self.take(8))[0]

    def string(self):
        return self.take(struct.unpack("<Q", self.take(8))[0]).decode(errors="replace")


def legacy(host, port, op, args):
    c = Conn(host, port)
    if op == "add":
        c.send(bytes([LEGACY["add"]]) + s(args[0]) + struct.pack("<q", int(args[1])))
        return c.i64()
    if op == "get":
        c.send(bytes([LEGACY["get"]]) + s(args[0]))
        return c.string()
    if op == "set":
        c.send(bytes([LEGACY["set"]]) + s(args[0]) + s(args[1]) + bytes([LEGACY["numkeys"]]))
        return c.i64()
    if op == "delete":
        c.send(bytes([LEGACY["delete"]]) + s(args[0]))
        return c.i64()
    if op == "numkeys":
        c.send(bytes([LEGACY["numkeys"]]))
        return c.i64()
    raise ValueError(op)


def current(host, port, op, args):
    c = Conn(host, port)
    if op == "delete_all_except":
        c.send(VALIDATE + bytes([DELETE_ALL_EXCEPT]) + s(args[0]))
        return c.i64()
    raise ValueError(op)


def torch_store(host, port, op, args):
    import torch.distributed as dist  # only these steps need torch

    store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=REPLY_TIMEOUT_S))
    try:
        if op == "add":
            return store.add(args[0], int(args[1]))
        if op == "get":
            return store.get(args[0]).decode(errors="replace")
    except RuntimeError:  # torch's client: the connection closed under it
        raise Closed()
    raise ValueError(op)


def main():
    host, port, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    for step in steps:
        dialect, op, *args = step.split(":")
        run = {"legacy": legacy, "current": current, "torch": torch_store}[dialect]
        try:
            result = run(host, port, op, args)
        except Closed:
            result = "CLOSED"
        print(json.dumps({"step": step, "result": result}), flush=True)


if __name__ == "__main__":
    main()
