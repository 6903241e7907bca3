"""The ring over plain TCP connections: the part of an MPI communicator that ring.py and the workers use
(Get_rank, Get_size, Sendrecv to the right neighbour from the left one, Barrier, Allgather), for a world whose
workers MPI cannot join: workers on emulated links (`--link`), each in its network namespace. Open MPI takes
processes on one machine for one node and publishes its TCP addresses to other nodes only, so its ranks in
namespaces of one machine find no way to each other; these sockets go over the links like any other traffic.

Each worker listens on its own address (the one its way to the job's Redis leaves from), writes it in the job's
store under the world's number (keys.py: ring addresses), connects to its right neighbour and accepts its left
one. A neighbour that is gone closes its connection: the worker's exchange fails with one line, and the
coordinator starts the world again without it."""
import socket
import struct
import threading
import time

import numpy as np

from ...errors import StoreError
from ..redis_client import local_address

CONNECT_S = 60.0                # for every worker of the world to say where it listens


class SocketRing:
    def __init__(self, store, rank, size, world_number):
        self.rank, self.size = int(rank), int(size)
        self.left_socket = self.right_socket = None
        if self.size == 1:
            return
        host = local_address(store.urls[0]) or "127.0.0.1"
        server = socket.create_server((host, 0))
        try:
            store.put_ring_address(world_number, self.rank, "%s:%d" % server.getsockname()[:2])
            addresses = self._addresses(store, world_number)
            right_host, right_port = addresses[(self.rank + 1) % self.size].rsplit(":", 1)
            self.right_socket = self._connect(right_host, int(right_port))
            self.right_socket.sendall(struct.pack("<I", self.rank))
            server.settimeout(CONNECT_S)
            while self.left_socket is None:
                conn, _ = server.accept()
                conn.settimeout(CONNECT_S)
                peer = struct.unpack("<I", self._exactly(conn, 4))[0]
                if peer == (self.rank - 1) % self.size:
                    conn.settimeout(None)
                    self.left_socket = conn
                else:
                    conn.close()
        except socket.timeout:
            raise StoreError("worker %d: its ring neighbours did not connect within %.0f s"
                             % (self.rank, CONNECT_S)) from None
        finally:
            server.close()
        for s in (self.left_socket, self.right_socket):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _addresses(self, store, world_number):
        deadline = time.monotonic() + CONNECT_S
        while True:
            found = store.ring_addresses(world_number)
            if len(found) >= self.size and all(r in found for r in range(self.size)):
                return found
            if time.monotonic() > deadline:
                raise StoreError("worker %d: %d of the %d workers said where they listen within %.0f s"
                                 % (self.rank, len(found), self.size, CONNECT_S))
            time.sleep(0.05)

    @staticmethod
    def _connect(host, port):
        deadline = time.monotonic() + CONNECT_S
        while True:
            try:
                return socket.create_connection((host, port), timeout=CONNECT_S)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @staticmethod
    def _exactly(conn, n):
        data = bytearray(n)
        view, got = memoryview(data), 0
        while got < n:
            k = conn.recv_into(view[got:])
            if k == 0:
                raise ConnectionError("a ring neighbour closed its connection")
            got += k
        return bytes(data)

    # --- the communicator's part the ring uses --------------------------------------------------------------------

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def Sendrecv(self, sendbuf, dest=None, recvbuf=None, source=None):
        """Send `sendbuf` to the right neighbour while `recvbuf` is filled from the left one (the ring's only
        pattern: dest and source are the neighbours)."""
        assert dest == (self.rank + 1) % self.size and source == (self.rank - 1) % self.size
        failed = []

        def send():
            try:
                self.right_socket.sendall(memoryview(sendbuf).cast("B"))
            except OSError as exc:
                failed.append(exc)
        sender = threading.Thread(target=send, name="ring-send", daemon=True)
        sender.start()
        into, got = memoryview(recvbuf).cast("B"), 0
        try:
            while got < into.nbytes:
                k = self.left_socket.recv_into(into[got:])
                if k == 0:
                    raise ConnectionError("worker %d's left neighbour closed its connection (gone)" % self.rank)
                got += k
        finally:
            sender.join()
        if failed:
            raise ConnectionError("worker %d's right neighbour is gone (%s)" % (self.rank, failed[0]))

    def Barrier(self):
        token, back = np.zeros(1, np.float32), np.zeros(1, np.float32)
        for _ in range(self.size - 1):
            self.Sendrecv(token, (self.rank + 1) % self.size, back, (self.rank - 1) % self.size)

    def Allgather(self, sendbuf, recvbuf):
        """Every worker's `sendbuf` into row r of `recvbuf` (size rows), passed round the ring."""
        recvbuf[self.rank] = sendbuf
        for step in range(self.size - 1):
            out, into = recvbuf[(self.rank - step) % self.size], recvbuf[(self.rank - step - 1) % self.size]
            self.Sendrecv(out, (self.rank + 1) % self.size, into, (self.rank - 1) % self.size)

    def close(self):
        for s in (self.left_socket, self.right_socket):
            if s is not None:
                s.close()
