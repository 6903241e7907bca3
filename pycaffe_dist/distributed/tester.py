"""The master's tester: scores a copy of W with the TEST nets on a thread of its own, so that merging goes on while
a test runs. Tested in the master's loop, a LeNet test of the 10,000 test images held every reply for ~0.6 s of
the master's time, four times in a 22 s job at 8 workers; SpeeDO ran its tester as a worker of its own for the
same reason. The layers' kernels and BLAS release the GIL, so the test takes another core where there is one."""
import threading

from ..solver.solver import Solver


class Tester:
    """`on_scores(iteration, scores)` gets each test's [(output name, mean)] per test net, on the tester's thread.
    One test at a time: starting one waits for the last."""

    def __init__(self, param, on_scores):
        self.solver = Solver(param)         # nets and weights of its own: W moves on while they are tested
        self.on_scores = on_scores
        self.thread, self.error = None, None

    def start(self, weights, iteration):
        """Test a copy of `weights` (taken now) as the weights after `iteration` merges."""
        self.wait()
        for mine, w in zip(self.solver.weights, weights):
            mine[...] = w
        self.thread = threading.Thread(target=self._run, args=(iteration,), name="tester", daemon=True)
        self.thread.start()

    def _run(self, iteration):
        try:
            self.on_scores(iteration, self.solver.test_at(iteration))
        except BaseException as exc:        # handed to the master's thread by wait()
            self.error = exc

    def wait(self):
        """Until the running test (if any) is done; its error, if it had one, is raised here."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error
