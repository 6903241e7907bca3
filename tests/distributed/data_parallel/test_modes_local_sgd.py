"""Local SGD's outer momentum lives in the master solver's history: a .solverstate snapshot holds it, and a master
started from that snapshot goes on with it (the rule itself: test_modes_rules.py; local SGD as sync:
test_equivalence.py)."""
import numpy as np
import pytest

from pycaffe_dist.io.solverstate import read_state

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_the_outer_momentum_is_in_the_snapshot_and_a_master_goes_on_with_it(procs, make_solver, tmp_path):
    options = ("--tau", 2, "--outer-momentum", 0.5)
    procs.master("outer", make_solver(max_iter=10), "local-sgd", 2, *options)
    procs.worker("outer", 0)
    procs.worker("outer", 1)
    procs.check("master")
    assert "Local SGD: outer momentum starts at 0" in procs.log("master")
    history = read_state(str(tmp_path / "snap_iter_10.solverstate"))["history"]
    assert all(np.isfinite(h).all() for h in history) and max(np.abs(h).max() for h in history) > 0
    procs.master("again", make_solver(max_iter=14), "local-sgd", 2, *options, "--snapshot",
                 tmp_path / "snap_iter_10.solverstate", name="master2")
    procs.start("worker2", "worker", "--redis", procs.url, "--job", "again", "--id", 0)
    procs.start("worker3", "worker", "--redis", procs.url, "--job", "again", "--id", 1)
    procs.check("master2")
    assert "Local SGD: outer momentum from the snapshot" in procs.log("master2")
    assert procs.stats("master2")["count"] == 14
