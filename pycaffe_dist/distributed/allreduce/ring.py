"""The ring all-reduce (Patarasuk and Yuan 2009; Baidu's and Horovod's): N processes in a ring each cut the buffer
into N chunks; in N - 1 steps of a reduce-scatter each passes one chunk to its right neighbour and adds the one from
its left into its own, so that each process then holds one chunk summed over all; in N - 1 steps of an all-gather
the summed chunks go round. Each process sends and receives 2 (N - 1) / N of the buffer, whatever N is: no process
is a hub.

Why our own ring on MPI's point-to-point, and not MPI_Allreduce: Open MPI picks its algorithm by message size and
process count, and the recursive doubling it picks for mid-sized buffers sends log2(N) times the buffer from every
process (3x at 8 workers); the ring's bytes are known, counted here (`sent`) and reported (hub_bytes_per_merge).
Each chunk's sum is added up once, at one process, in the ring's order, then copied round: every process ends with
the same bits, as the workers' weights must be."""
import numpy as np


class Ring:
    """Sum float32 buffers over the processes of an MPI communicator (mpi4py), in place."""

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.right, self.left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self.sent = 0               # bytes this process has sent, all calls together
        self._scratch = np.empty(0, np.float32)

    def bounds(self, length):
        """Where the N chunks of a buffer of `length` floats begin and end (the first length % N one longer)."""
        base, extra = divmod(length, self.size)
        edges = [0]
        for i in range(self.size):
            edges.append(edges[-1] + base + (1 if i < extra else 0))
        return edges

    def allreduce(self, buffer):
        """Sum the 1-D float32 `buffer` over every process, in place; every process ends with the same bits."""
        n = self.size
        if n == 1:
            return buffer
        edges = self.bounds(buffer.size)
        if self._scratch.size < edges[1] - edges[0]:
            self._scratch = np.empty(edges[1] - edges[0], np.float32)

        def chunk(i):
            i %= n
            return buffer[edges[i]:edges[i + 1]]
        # reduce-scatter: at step s this process sends chunk (rank - s) and adds what comes in into chunk
        # (rank - s - 1); after N - 1 steps it holds chunk (rank + 1) summed over all
        for step in range(n - 1):
            out, into = chunk(self.rank - step), chunk(self.rank - step - 1)
            incoming = self._scratch[:into.size]
            self.comm.Sendrecv(out, dest=self.right, recvbuf=incoming, source=self.left)
            np.add(into, incoming, out=into)
            self.sent += out.nbytes
        # all-gather: the summed chunks go round, each copied where it belongs
        for step in range(n - 1):
            out, into = chunk(self.rank + 1 - step), chunk(self.rank - step)
            self.comm.Sendrecv(out, dest=self.right, recvbuf=into, source=self.left)
            self.sent += out.nbytes
        return buffer
