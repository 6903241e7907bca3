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
    """Sum float32 buffers over the processes of an MPI communicator (mpi4py), in place: at once (allreduce), or step
    by step while the caller does other work (start: where the communicator has MPI's non-blocking Isend/Irecv)."""

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.right, self.left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self.sent = 0               # bytes this process has sent, all calls together
        self._scratch = np.empty(0, np.float32)
        # the sockets of sockets.py have only the blocking Sendrecv
        self.nonblocking = hasattr(comm, "Isend") and hasattr(comm, "Irecv")

    def bounds(self, length):
        """Where the N chunks of a buffer of `length` floats begin and end (the first length % N one longer)."""
        base, extra = divmod(length, self.size)
        edges = [0]
        for i in range(self.size):
            edges.append(edges[-1] + base + (1 if i < extra else 0))
        return edges

    def steps(self, buffer):
        """The ring's 2 (N - 1) steps over `buffer`: (the chunk sent right, the chunk the left one's goes to, whether
        it is added in). Reduce-scatter: at step s this process sends chunk (rank - s) and adds what comes in into
        chunk (rank - s - 1); after N - 1 steps it holds chunk (rank + 1) summed over all. All-gather: the summed
        chunks go round, each copied where it belongs."""
        n = self.size
        edges = self.bounds(buffer.size)

        def chunk(i):
            i %= n
            return buffer[edges[i]:edges[i + 1]]
        for step in range(n - 1):
            yield chunk(self.rank - step), chunk(self.rank - step - 1), True
        for step in range(n - 1):
            yield chunk(self.rank + 1 - step), chunk(self.rank - step), False

    def scratch(self, length):
        """Where an added chunk comes in (one buffer: a process runs one ring step at a time)."""
        if self._scratch.size < length:
            self._scratch = np.empty(length, np.float32)
        return self._scratch[:length]

    def allreduce(self, buffer):
        """Sum the 1-D float32 `buffer` over every process, in place; every process ends with the same bits."""
        if self.size > 1:
            for out, into, add in self.steps(buffer):
                incoming = self.scratch(into.size) if add else into
                self.comm.Sendrecv(out, dest=self.right, recvbuf=incoming, source=self.left)
                if add:
                    np.add(into, incoming, out=into)
                self.sent += out.nbytes
        return buffer

    def start(self, buffer):
        """The sum of `buffer` as a RingSum that its owner advances (progress) between other work, or waits for:
        the same steps, and so the same bits, as allreduce(). Needs the non-blocking calls (`nonblocking`). Only one
        may be under way at a time, as only one allreduce() may (the messages of their steps would cross)."""
        return RingSum(self, buffer)


class RingSum:
    """One sum over the ring, a step at a time on MPI's non-blocking calls. Why not a thread that blocks in
    Sendrecv: with as many processes as cores, a blocked thread waits for the scheduler to give it the core back
    from the backward's thread after every message (4.7 ms for LeNet's 1.6 MB bucket at 2 workers on 2 cores, where
    the copies take 0.1 ms); advanced from the backward's own hooks, each step is posted, and found done, between
    two layers, and the copies are made by whichever of the two processes gets to MPI first (Open MPI's shared
    memory reads the peer's buffer in one copy)."""

    def __init__(self, ring, buffer):
        from mpi4py import MPI
        self._testall, self._waitall = MPI.Request.Testall, MPI.Request.Waitall
        self.ring, self.buffer = ring, buffer
        self._steps = ring.steps(buffer) if ring.size > 1 else iter(())
        self._step = None               # (out, into, add, incoming) of the step under way
        self._requests = []
        self.done = False
        self._post()

    def _post(self):
        step = next(self._steps, None)
        if step is None:
            self._step, self.done = None, True
            return
        out, into, add = step
        incoming = self.ring.scratch(into.size) if add else into
        comm, ring = self.ring.comm, self.ring
        self._requests = [comm.Irecv(incoming, source=ring.left), comm.Isend(out, dest=ring.right)]
        self._step = (out, into, add, incoming)

    def _complete(self):
        out, into, add, incoming = self._step
        if add:
            np.add(into, incoming, out=into)
        self.ring.sent += out.nbytes
        self._post()

    def progress(self):
        """Take every step whose messages have arrived, without waiting; whether the sum is done."""
        while not self.done and self._testall(self._requests):
            self._complete()
        return self.done

    def wait(self):
        """Take the remaining steps, waiting for each."""
        while not self.done:
            self._waitall(self._requests)
            self._complete()
        return self.buffer
