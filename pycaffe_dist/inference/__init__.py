"""Running trained nets over many inputs: `classify.py` (Caffe's python/classify.py, with labels, top-k and
CSV/JSON output: the `dist_caffe classify` verb) and `features.py` (Caffe's tools/extract_features: the
`dist_caffe extract-features` verb).

Both can run for long, so both report on stderr through `Progress`: a line redrawn in place on a terminal; on a
log file or pipe a line every few seconds (redraws would pile up there), and a summary line at the end.
"""
import sys
import time


class Progress:
    """Counts images towards `total`: "what: n/total images pct, R images/s, ETA h:mm:ss"."""

    def __init__(self, what, total, stream=None, every_s=None):
        self.what, self.total, self.count = what, total, 0
        self.stream = stream if stream is not None else sys.stderr
        self.live = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every_s = every_s if every_s is not None else (0.2 if self.live else 10.0)
        self.start = self.shown = time.monotonic()

    def step(self, n=1):
        self.count += n
        now = time.monotonic()
        if now - self.shown >= self.every_s:
            self.shown = now
            self._show(self.line(now))

    def line(self, now=None):
        elapsed = max((now if now is not None else time.monotonic()) - self.start, 1e-9)
        rate = self.count / elapsed
        left = (self.total - self.count) / rate if rate > 0 else 0.0
        left = int(round(max(left, 0.0)))
        return ("%s: %d/%d images %3.0f%%, %.0f images/s, ETA %d:%02d:%02d"
                % (self.what, self.count, self.total, 100.0 * self.count / max(self.total, 1), rate,
                   left // 3600, left // 60 % 60, left % 60))

    def _show(self, text):
        self.stream.write(("\r\x1b[K" + text) if self.live else text + "\n")
        self.stream.flush()

    def close(self):
        """The summary line (after clearing a live line): count, seconds and rate."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        if self.live:
            self.stream.write("\r\x1b[K")
        self.stream.write("%s: %d images in %.1f s (%.0f images/s)\n"
                          % (self.what, self.count, elapsed, self.count / elapsed))
        self.stream.flush()
