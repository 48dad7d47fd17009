"""The sockets of a worker's process, for dist_launch.elastic: which ones a group's set-up opened
(by inode, from /proc/self/fd), shutting those down so that whatever waits on them fails at once,
connecting to a listening one in a dead peer's place, and a store connection of its own that waits
for one key. Standard library only; nothing here closes a socket it did not open."""

import os
import socket
import struct
import threading


def socket_inodes():
    """This process's sockets: {inode: descriptor}."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(name)
    return found


def shut_down(inodes, store_too: bool = False) -> None:
    """Shuts down for reading (without closing: they are not ours to close) the connections to
    the peers among the sockets with these inodes: whatever of this process waits on them wakes
    with an error. Not for writing: gloo's tcp pair queues a send whose write fails (EPIPE, or a
    reset from a peer that closed its socket) and never fails it, nor the collective around it,
    which waits out the group's timeout (a 2-rank barrier loop under load: 10 of 60 stuck with
    SHUT_RDWR, none of 60 with SHUT_RD). A listening socket is left alone (gloo since 2023 aborts
    the process when its accept fails: see connect_in_place_of), and so is a connection to the
    store unless `store_too`."""
    store_port = -1 if store_too else int(os.environ.get("MASTER_PORT", "0"))
    for _, sock in tcp_sockets(inodes):
        try:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            if not listening and sock.getpeername()[1] != store_port:
                sock.shutdown(socket.SHUT_RD)
        except (OSError, IndexError, ValueError):
            pass


def tcp_sockets(inodes):
    """(inode, socket) for each TCP socket of this process among these inodes (gloo's and the
    store's; a Unix socket of the script's is no peer), borrowed: detached, never closed, once
    the caller moves on."""
    current = socket_inodes()
    for inode in inodes:
        fd = current.get(inode)
        if fd is None:
            continue
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and \
                    sock.type == socket.SOCK_STREAM:
                yield inode, sock
        finally:
            sock.detach()


def listening(inodes):
    """{inode: (host, port)} of the listening TCP sockets among these inodes, a wildcard address
    given as the loopback one."""
    found = {}
    for inode, sock in tcp_sockets(inodes):
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                host, port = sock.getsockname()[:2]
                if host in ("0.0.0.0", "::"):
                    host = "127.0.0.1" if sock.family == socket.AF_INET else "::1"
                found[inode] = (host, port)
        except OSError:
            pass
    return found


def descriptors_to_spare() -> int:
    """How many more descriptors this process may open, less a margin for its own work."""
    import resource
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return soft - len(os.listdir("/proc/self/fd")) - 64


def connect_in_place_of(ranks, address, over: threading.Event) -> None:
    """Connects to the listening socket at `address` in each of `ranks`' place, in that order,
    writing the 8 bytes the connecting side of a gloo pair writes (the number of the pair it
    connects to), and closes: a pair waiting for that peer is handed a connection that is already
    closed, and fails at once. gloo since 2023 listens for every pair on one socket of the device
    (which numbers the pairs of the group it was made for by rank: pair i waits for i) and aborts
    the process when its accept fails, so that socket cannot be shut down; the system's gloo of
    2022 (Debian's torch 1.13) has a listening socket of each pair's own and takes any connection
    on it. Each connection a pair does not wait for stays open in gloo until the group is
    destroyed: they stop short of the descriptors this process may open (descriptors_to_spare),
    and when the set-up is over."""
    for rank in ranks[:max(0, descriptors_to_spare())]:
        if over.is_set():
            return
        try:
            with socket.create_connection(address, timeout=1.0) as peer:
                peer.sendall(struct.pack("=q", rank))
        except OSError:
            return  # (the set-up is gone: the socket with it)


class GenerationWaiter:
    """A connection to the agent's store that waits for one key at a time, in the c10d TCPStore
    protocol's current dialect (store/src/protocol.h): VALIDATE, then WAIT with a list of
    one key, answered with the byte STOP_WAITING once the key exists. The store is always
    dist-launch's under the in-place policy. Keys travel with the "/" torch's client puts first."""

    _VALIDATE, _WAIT, _MAGIC, _STOP_WAITING = 0, 6, 0x3C85F7CE, b"\x00"

    def __init__(self, host: str, port: int, timeout_s: float):
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        self._sock.settimeout(None)
        self._sock.sendall(struct.pack("<BI", self._VALIDATE, self._MAGIC))

    def wait(self, key: str) -> None:
        """Blocks until `key` exists; OSError when the connection is shut down or lost."""
        name = ("/" + key).encode()
        self._sock.sendall(struct.pack("<BQQ", self._WAIT, 1, len(name)) + name)
        reply = self._sock.recv(1)
        if reply != self._STOP_WAITING:
            raise ConnectionError(f"the store answered {reply!r} to a wait for {key}")

    def wake(self) -> None:
        """Ends a wait in another thread (it raises OSError): the connection is shut down."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self._sock.close()
