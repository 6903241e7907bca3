import pathlib
import signal

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"      # the tests' data: tests/fixtures/README.md says where each came from
GOLDEN = FIXTURES / "golden"
ZOO = FIXTURES / "zoo"


def load_npz(path):
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture
def golden():
    if not GOLDEN.is_dir():
        pytest.fail("tests/fixtures/golden is missing: the checkout is incomplete")
    return GOLDEN


@pytest.fixture(autouse=True)
def signals_left_as_found():
    """A test that leaves SIGINT or SIGTERM handled, ignored or blocked in this process fails (and the state is put
    back): an ignored or blocked signal is inherited by every process started later, and a worker that ignores
    Ctrl-C hangs the test that sends it, far from the cause."""
    def state():
        return (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM),
                signal.pthread_sigmask(signal.SIG_BLOCK, []))
    before = state()
    yield
    after = state()
    if after != before:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])
        signal.pthread_sigmask(signal.SIG_SETMASK, before[2])
        pytest.fail("the test left the signal state changed: SIGINT %r -> %r, SIGTERM %r -> %r, blocked %s -> %s"
                    % (before[0], after[0], before[1], after[1], sorted(before[2]), sorted(after[2])))
