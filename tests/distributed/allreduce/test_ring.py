"""The ring all-reduce (distributed/allreduce/ring.py) in real MPI worlds: the sum, the same bits on every process,
and the bytes each process sends (2 (N - 1) / N of the buffer, whatever N is); a step at a time (RingSum, on MPI's
non-blocking calls) the same bits as at once."""
import json

import pytest

from .conftest import mpiexec, needs_mpi

pytestmark = needs_mpi

SCRIPT = r"""
import hashlib, json, sys
import numpy as np
from mpi4py import MPI
from pycaffe_dist.distributed.allreduce.ring import Ring
comm = MPI.COMM_WORLD
ring = Ring(comm)
out = []
for length in %(lengths)s:
    mine = np.random.default_rng([length, comm.rank]).standard_normal(length).astype(np.float32)
    expected = sum(np.random.default_rng([length, r]).standard_normal(length).astype(np.float64)
                   for r in range(comm.size))
    before = ring.sent
    got = ring.allreduce(mine.copy())
    sent = ring.sent - before
    # the same sum a step at a time (RingSum): advanced only by progress(), and by wait()
    stepped = ring.start(mine.copy())
    while not stepped.progress():
        pass
    waited = ring.start(mine.copy()).wait()
    out.append({"length": length, "error": float(np.abs(got - expected).max()) if length else 0.0,
                "digest": hashlib.sha1(got.tobytes()).hexdigest(), "sent": sent,
                "stepped": [hashlib.sha1(a.tobytes()).hexdigest() for a in (stepped.buffer, waited)],
                "stepped_sent": ring.sent - before - sent})
print(json.dumps({"rank": comm.rank, "out": out}))
"""
LENGTHS = [0, 1, 3, 7, 1000, 250001]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_the_ring_sums_to_the_same_bits_everywhere_and_sends_its_share(n, tmp_path):
    script = tmp_path / "ring.py"
    script.write_text(SCRIPT % {"lengths": LENGTHS})
    done = mpiexec(n, [str(script)])
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in ranks) == list(range(n))
    for i, length in enumerate(LENGTHS):
        results = [r["out"][i] for r in ranks]
        assert all(r["error"] < 1e-4 * n for r in results), results
        assert len({r["digest"] for r in results}) == 1, "the processes hold different sums of %d floats" % length
        for r in results:   # a step at a time: the same bits as at once, and the same bytes twice over
            assert r["stepped"] == [r["digest"]] * 2 and r["stepped_sent"] == 2 * r["sent"]
        for r in results:
            # N - 1 chunks out in each half; the chunks of the first (length % N) processes are one float longer
            assert r["sent"] <= 2 * (n - 1) * 4 * -(-length // n)
            assert r["sent"] >= 2 * (n - 1) * 4 * (length // n)
