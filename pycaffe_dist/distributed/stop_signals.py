"""How a master (master.py, pipeline_master.py, sandblaster_master.py) is asked to stop: SIGINT (Ctrl-C, or the
launcher passing one on) and SIGTERM (systemd, `kill`, or a launcher that died: launch.die_with_launcher) ask it to
finish cleanly (snapshot, test, stop the workers). A second SIGINT forces it (KeyboardInterrupt), as a second Ctrl-C
should; a second SIGTERM does not, because Linux may deliver a parent-death signal more than once (once per thread
of the child that asked for it), and the first one already asked."""
import logging
import signal
import threading

log = logging.getLogger("pycaffe_dist.distributed")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def catch(request_stop):
    """Call request_stop(forced) on the stop signals (forced: a repeated SIGINT) while the master runs; returns the
    function that puts the previous handlers back. Handlers exist in the main thread only: elsewhere, nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    asked = []

    def handler(number, frame):
        forced = number == signal.SIGINT and signal.SIGINT in asked
        asked.append(number)
        request_stop(forced)
    previous = {number: signal.signal(number, handler) for number in STOP_SIGNALS}

    def restore():
        for number, old in previous.items():
            signal.signal(number, old)
    return restore


class StopRequests:
    """A master's side: `stop_requested` is set by the first request (its loop then finishes cleanly); a forced one
    raises KeyboardInterrupt. `stopping_whom` names what a clean stop stops, for the log line."""
    stop_requested = False
    stopping_whom = "the workers"

    def _request_stop(self, forced):
        if forced:
            raise KeyboardInterrupt
        if self.stop_requested:
            return
        log.info("Stop requested: finishing (snapshot, test, stopping %s)", self.stopping_whom)
        self.stop_requested = True
