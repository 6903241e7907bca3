import pathlib
import signal
import warnings

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


def os_signal_masks():
    """(ignored, blocked) bits of SIGINT and SIGTERM as the kernel has them for this process's main thread (C code,
    a library's init, can change them behind the signal module's back)."""
    fields = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
    ours = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    return int(fields["SigIgn"], 16) & ours, int(fields["SigBlk"], 16) & ours


@pytest.fixture(autouse=True, scope="session")
def sigint_not_ignored():
    """Ctrl-C reaches the processes the tests start. A run started in the background of a shell without job control
    (`cmd &` in a script, nohup) inherits SIGINT ignored, and so would every worker started from it: Python keeps an
    inherited SIG_IGN, so a test that sends SIGINT to a worker would wait for it in vain (as the wire-faults test
    did in every CI run started that way)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture(autouse=True)
def signals_left_as_found(request):
    """A test that leaves SIGINT or SIGTERM handled, ignored or blocked in this process is named in a warning (the
    run's warnings summary) and the state is put back: an ignored or blocked signal is inherited by every process
    started later, and a worker that ignores Ctrl-C hangs the test that sends it, far from the cause."""
    def state():
        return (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM),
                signal.pthread_sigmask(signal.SIG_BLOCK, []), os_signal_masks())
    before = state()
    yield
    after = state()
    if after != before:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])
        signal.pthread_sigmask(signal.SIG_SETMASK, before[2])
        warnings.warn("%s left the signal state changed (put back): SIGINT %r -> %r, SIGTERM %r -> %r, blocked %s -> "
                      "%s, kernel's (ignored, blocked) bits %s -> %s" % (
                          request.node.nodeid, before[0], after[0], before[1], after[1], sorted(before[2]),
                          sorted(after[2]), before[3], after[3]), RuntimeWarning)
