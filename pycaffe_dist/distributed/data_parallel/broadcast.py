"""Compressed W updates, the other way of `--compress`: in the round modes (sync, local-sgd), where every worker
starts a round from the same W, the master sends each round's change of W compressed, instead of W itself.

Why: compressing the results alone left W coming down whole. Over a 100 Mbit/s link, sync with `--compress 1bit`
sent 60 KB up and pulled 1.7 MB down per worker per round, and spent 90 % of each round exchanging.

How (the server side of 1-bit SGD's error feedback, as in DoubleSqueeze, Tang et al. 2019, and 1-bit Adam, Tang
et al. 2021): after a round's step the master takes u = (W_new - W_before) + r, where r is what earlier updates
left out; it encodes u with the job's codec (compression.Format), decodes the payload itself as a worker will, keeps
r = u - û, and sets W = W_before + û. So the master's W is exactly what the workers can rebuild: a worker holding
W_before (its last pull, whole or rebuilt) adds û with the same float32 additions (exact IEEE sums: the same bits on
every CPU) and has the new W bit for bit. A worker that does not hold W_before (it joined, was dropped or reset, or
a round closed without it) pulls W whole, which the master still publishes every round (for those, for the tests,
snapshots and --resume). The update of merge v is stored with version v and goes from W at v - 1 to W at v; a
worker applies it only when its own W is at v - 1.

W moves by the compressed mean, so the exchange is compressed both ways; r keeps the part of the mean not sent for
the next rounds, as each worker's residual keeps the part of its result not sent."""
import numpy as np


class MasterUpdates:
    """The master's side: begin(W) before a round's step, end(W, version) after it (W becomes W_before + û);
    `payload` and `version` are the last update's, for the publisher."""

    def __init__(self, format, shapes):
        self.format = format
        self.before = [np.empty(s, np.float32) for s in shapes]
        self.residual = [np.zeros(s, np.float32) for s in shapes]
        self.decoded = [np.empty(s, np.float32) for s in shapes]
        self.payload, self.version = None, None

    def begin(self, weights):
        for b, w in zip(self.before, weights):
            np.copyto(b, w)

    def end(self, weights, version):
        for r, w, b in zip(self.residual, weights, self.before):
            r += w
            r -= b                                  # r + (W_new - W_before)
        payload = self.format.encode(self.residual)
        self.format.decode(payload, self.decoded)
        for r, d, w, b in zip(self.residual, self.decoded, weights, self.before):
            r -= d
            np.add(b, d, out=w)                     # what every worker holding W_before computes
        self.payload, self.version = payload, version

    def forget(self):
        """W was set otherwise (published again, resumed): what the updates owed it goes."""
        for r in self.residual:
            r[...] = 0
        self.payload = self.version = None


class WorkerUpdates:
    """A worker's side: the W it holds exactly (`known`, at merge `version`), kept from its whole pulls and the
    updates it applies."""

    def __init__(self, format, shapes):
        self.format = format
        self.known = [np.empty(s, np.float32) for s in shapes]
        self.decoded = [np.empty(s, np.float32) for s in shapes]
        self.payload = np.empty(format.shape, np.float32)
        self.version = None
        self.applied = self.whole = 0           # pulls by update, pulls of W whole

    def pulled_whole(self, weights, version):
        for k, w in zip(self.known, weights):
            np.copyto(k, w)
        self.version = version
        self.whole += 1

    def apply(self, payload, version, out):
        """W at `version` into `out` from the update of that merge, if the W held is the one before it; False
        (nothing changed) otherwise, and the caller pulls W whole. A damaged payload raises compression.Damaged."""
        if self.version is None or version != self.version + 1:
            return False
        self.format.decode(payload, self.decoded)
        for k, d, o in zip(self.known, self.decoded, out):
            np.add(k, d, out=k)
            np.copyto(o, k)
        self.version = version
        self.applied += 1
        return True

    def forget(self):
        self.version = None
