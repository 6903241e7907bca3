"""Runs a harness on mutated inputs for a while and reports what escapes: the fuzz campaigns of test_readers.py.

An input is a finding when, in the reader:
- an exception other than our own (PycaffeDistError) escapes;
- it takes more than PCD_FUZZ_INPUT_SECONDS (default 2) of CPU time (ITIMER_PROF interrupts it);
- the process's peak resident memory grows by more than PCD_FUZZ_MAX_MB (default 512 MiB) while it runs, or an
  allocation fails under the address-space limit (the start's size + 4 x PCD_FUZZ_MAX_MB);
- the process dies (a crash in C) or stops answering for 60 s (a hang in C, where no signal gets through).

A campaign runs in a child process (`python -m tests.fuzz.runner plain|atheris ...`), so that limits, crashes and hangs
stay out of pytest's process; the child writes each input to a file before running it, so the parent still has
it when the child dies. Input i of a campaign is seed i for the first len(seeds), then a mutation drawn from
random.Random("<seed>:<i>"): a campaign is reproducible from (PCD_FUZZ_SEED, index), whatever the machine's
speed, and a child that stopped on a finding is restarted at the next index.

Findings are saved under regressions/<reader>/<sha1 of the input>: one input per distinct exception (its type and
innermost frame), the first five of each kind that has no frame (slow, memory, crash, hang); the count of others
in the report.
"""
import argparse
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import pathlib
import random
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
REGRESSIONS = HERE / "regressions"
REPO = HERE.parent.parent
HANG_SECONDS = 60
FUZZ_IMAGE_VALUES = 1 << 22   # the image bound in campaigns (see run_one)
LOCATIONLESS_KEPT = 5      # inputs saved per kind of finding that has no frame (slow, memory, crash, hang)
_MB = 1 << 20


def settings():
    env = os.environ
    return {"seconds": float(env.get("PCD_FUZZ_SECONDS", 10)), "seed": env.get("PCD_FUZZ_SEED", "0"),
            "input_seconds": float(env.get("PCD_FUZZ_INPUT_SECONDS", 2)),
            "max_mb": int(env.get("PCD_FUZZ_MAX_MB", 512)), "engine": engine()}


def engine():
    """"atheris" where it is importable, unless PCD_FUZZ_ENGINE=plain; else "plain" (what CI runs)."""
    if os.environ.get("PCD_FUZZ_ENGINE", "auto") == "plain":
        return "plain"
    return "atheris" if importlib.util.find_spec("atheris") is not None else "plain"


class InputTooSlow(BaseException):
    """Raised in the reader by the CPU-time alarm (a BaseException, so that no `except Exception` swallows it)."""


def _alarm(signum, frame):
    raise InputTooSlow()


def _maxrss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _where(exc):
    """file:line of the innermost frame, for telling findings apart."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    frame = frames[-1]
    path = frame.filename
    for root in (str(REPO) + os.sep, os.path.dirname(os.__file__) + os.sep):
        if path.startswith(root):
            path = path[len(root):]
    return "%s:%d" % (path, frame.lineno)


def run_one(harness, data, workdir, input_seconds, max_mb):
    """Run the harness on one input; None when the reader behaved, else a finding (a dict)."""
    from pycaffe_dist.errors import PycaffeDistError
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    before = _maxrss_mb()
    start, cpu = time.monotonic(), time.process_time()
    finding = None
    # Images up to 4 Mi values: a header can ask for MAX_IMAGE_VALUES (64 Mi), which a reader then decodes on
    # purpose, and four decodes of that in one input would pass the time limit. The bound itself is tested in
    # tests/data/test_images.py.
    bound = os.environ.get("PCD_MAX_IMAGE_VALUES")
    os.environ["PCD_MAX_IMAGE_VALUES"] = str(FUZZ_IMAGE_VALUES)
    previous = signal.signal(signal.SIGPROF, _alarm)
    signal.setitimer(signal.ITIMER_PROF, input_seconds)
    try:
        harness.run(data, workdir)
    except PycaffeDistError:
        pass
    except InputTooSlow:
        finding = {"kind": "slow", "detail": "more than %.1f s of CPU" % input_seconds, "where": ""}
    except MemoryError as exc:
        finding = {"kind": "memory", "detail": "MemoryError %s" % exc, "where": _where(exc)}
    except Exception as exc:
        finding = {"kind": "exception", "detail": "%s: %s" % (type(exc).__name__, str(exc)[:300]),
                   "type": type(exc).__name__, "where": _where(exc),
                   "traceback": "".join(traceback.format_exception(exc))[-3000:]}
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
        if bound is None:
            del os.environ["PCD_MAX_IMAGE_VALUES"]
        else:
            os.environ["PCD_MAX_IMAGE_VALUES"] = bound
        shutil.rmtree(workdir, ignore_errors=True)
    grown = _maxrss_mb() - before
    if finding is None and grown > max_mb:
        finding = {"kind": "memory", "detail": "peak memory grew by %.0f MiB" % grown, "where": ""}
    if finding is not None:
        finding.update(cpu=time.process_time() - cpu, wall=time.monotonic() - start)
    return finding


def signature(finding):
    return "%s %s %s" % (finding["kind"], finding.get("type", ""), finding["where"])


def save(reader, ext, data):
    """The input as regressions/<reader>/<sha1 12><ext> (kept if already there); returns its path."""
    folder = REGRESSIONS / reader
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (hashlib.sha1(data).hexdigest()[:12] + ext)
    if not path.exists():
        path.write_bytes(data)
    return path


def regression_inputs(reader):
    folder = REGRESSIONS / reader
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


# -- the child: one campaign ---------------------------------------------------------------------------------------
def _limit_memory(max_mb):
    """Address space: what the process has now plus 4 x max_mb; beyond it allocations fail (MemoryError)."""
    with open("/proc/self/statm") as f:
        size = int(f.read().split()[0]) * resource.getpagesize()
    limit = size + 4 * max_mb * _MB
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))


# The modules the harnesses reach, imported under atheris's instrumentation (coverage for its guidance).
_READER_MODULES = ["pycaffe_dist.proto.binary", "pycaffe_dist.io.prototxt", "pycaffe_dist.io.upgrade",
                   "pycaffe_dist.io.load", "pycaffe_dist.io.caffemodel", "pycaffe_dist.io.solverstate",
                   "pycaffe_dist.io.pycaffe_io", "pycaffe_dist.blob.binaryproto", "pycaffe_dist.data.sources",
                   "pycaffe_dist.data.lmdb_check", "pycaffe_dist.data.images", "pycaffe_dist.data.hdf5",
                   "pycaffe_dist.data.idx", "pycaffe_dist.data.batches", "pycaffe_dist.data.transform",
                   "pycaffe_dist.data.convert", "pycaffe_dist.layers.data", "pycaffe_dist.net.net",
                   "pycaffe_dist.solver.training_log"]


def _prepare(reader, scratch, max_mb, exclude=()):
    """(harness, seed pool, mutator) of a child, the memory limit set. The pool is the harness's seeds and the saved
    regression inputs but those of `exclude` (saved by this campaign: the pool stays what it was at its start, and
    libFuzzer, which runs its whole corpus first, does not find them again at each restart)."""
    from tests.fuzz.harnesses import HARNESSES
    from tests.fuzz.mutate import Mutator
    logging.getLogger("pycaffe_dist").setLevel(logging.ERROR)     # "upgraded on load" at every other input
    harness = HARNESSES[reader]
    (scratch / "seeds").mkdir()
    pool = harness.seeds(scratch / "seeds") + [p.read_bytes() for p in regression_inputs(reader)
                                               if p.name not in exclude]
    _limit_memory(max_mb)
    return harness, pool, Mutator(pool, harness.kinds)


def _report_finding(scratch, finding, data, tried):
    # the input beside the report: the parent reads it after this process has moved on
    (scratch / ("finding-%d" % finding["index"])).write_bytes(data)
    print(json.dumps({"finding": finding, "tried": tried}), flush=True)


def child_atheris(reader, seed, start, seconds, input_seconds, max_mb, scratch, exclude=()):
    """The campaign under atheris (libFuzzer, coverage-guided), our mutations offered beside its own. A finding
    ends the process (exit 3) as in the plain child; libFuzzer handles crashes and its own time limit."""
    import atheris
    with atheris.instrument_imports(include=["pycaffe_dist"]):
        for name in _READER_MODULES:
            importlib.import_module(name)
    scratch = pathlib.Path(scratch)
    harness, pool, mutator = _prepare(reader, scratch, max_mb, exclude)
    corpus = scratch / "corpus"
    corpus.mkdir()
    for i, data in enumerate(pool):
        (corpus / ("seed-%d" % i)).write_bytes(data)
    current, state = scratch / "current", {"tried": start, "reported": time.monotonic()}

    def one_input(data):
        index = state["tried"]
        current.write_bytes(index.to_bytes(8, "little") + data)
        finding = run_one(harness, data, scratch / "input", input_seconds, max_mb)
        state["tried"] = index + 1
        if finding is not None:
            finding["index"] = index
            _report_finding(scratch, finding, data, index + 1)
            os._exit(3)
        if time.monotonic() - state["reported"] > 0.5:
            print(json.dumps({"tried": index + 1}), flush=True)
            state["reported"] = time.monotonic()

    def mutate(data, max_size, mutation_seed):
        rng = random.Random(mutation_seed)
        if rng.random() < 0.5:
            return atheris.Mutate(data, max_size)
        return mutator.mutate(rng, data)[:max_size]

    print(json.dumps({"ready": len(pool)}), flush=True)
    seed_number = int(hashlib.sha1(("%s:%d" % (seed, start)).encode()).hexdigest()[:7], 16)
    atheris.Setup([sys.argv[0], "-max_total_time=%d" % max(1, int(seconds)), "-seed=%d" % seed_number,
                   "-timeout=%d" % HANG_SECONDS, "-rss_limit_mb=0", "-print_final_stats=0",
                   "-max_len=%d" % (2 * max(len(p) for p in pool)), "-artifact_prefix=%s/" % scratch, str(corpus)],
                  one_input, custom_mutator=mutate)
    atheris.Fuzz()
    return 0


def child(reader, seed, start, seconds, input_seconds, max_mb, scratch, exclude=()):
    scratch = pathlib.Path(scratch)
    harness, pool, mutator = _prepare(reader, scratch, max_mb, exclude)
    current = scratch / "current"
    deadline = time.monotonic() + seconds
    index, reported = start, time.monotonic()
    print(json.dumps({"ready": len(pool)}), flush=True)
    while time.monotonic() < deadline:
        data = pool[index] if index < len(pool) else harness.mutate(random.Random("%s:%d" % (seed, index)), mutator)
        current.write_bytes(index.to_bytes(8, "little") + data)
        finding = run_one(harness, data, scratch / "input", input_seconds, max_mb)
        index += 1
        if finding is not None:
            finding["index"] = index - 1
            _report_finding(scratch, finding, data, index)
            if finding["kind"] in ("slow", "memory"):
                return 3          # the reader was interrupted anywhere: start afresh
        if time.monotonic() - reported > 0.5:
            print(json.dumps({"tried": index}), flush=True)
            reported = time.monotonic()
    print(json.dumps({"tried": index, "done": True}), flush=True)
    return 0


# -- the parent: a campaign over restarts ------------------------------------------------------------------------
def campaign(reader, seconds=None, seed=None, log=None):
    """Fuzz `reader` for `seconds` (PCD_FUZZ_SECONDS); returns {"tried", "seconds", "findings", "saved"}."""
    from tests.fuzz.harnesses import HARNESSES
    config = settings()
    seconds = config["seconds"] if seconds is None else seconds
    seed = config["seed"] if seed is None else seed
    ext = HARNESSES[reader].ext
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONHASHSEED="0")
    began = time.monotonic()
    index, findings, saved = 0, [], {}
    with tempfile.TemporaryDirectory(prefix="pcd-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None) \
            as scratch:
        while True:
            left = seconds - (time.monotonic() - began)
            if left <= 0:
                break
            for sub in pathlib.Path(scratch).iterdir():
                shutil.rmtree(sub) if sub.is_dir() else sub.unlink()
            command = [sys.executable, "-m", "tests.fuzz.runner", config["engine"], reader, "--seed", str(seed),
                       "--start", str(index), "--seconds", str(left), "--input-seconds",
                       str(config["input_seconds"]), "--max-mb", str(config["max_mb"]), "--scratch", scratch,
                       "--exclude", ",".join(os.path.basename(path) for path in saved.values())]
            proc = subprocess.Popen(command, cwd=str(REPO), env=env, stdout=subprocess.PIPE, text=True)
            index, ended = _follow(proc, reader, ext, index, findings, saved, scratch, log)
            if ended:
                break
    return {"tried": index, "seconds": time.monotonic() - began, "findings": findings, "saved": saved}


def _record(finding, data, reader, ext, findings, saved, log):
    findings.append(finding)
    key = signature(finding)
    if finding["kind"] in ("slow", "memory", "crash", "hang"):
        # no frame tells these apart: keep the first few inputs of each, they may be different bugs
        number = sum(1 for f in findings if signature(f) == key)
        if number > LOCATIONLESS_KEPT:
            return
        key = "%s #%d" % (key, number)
    if key not in saved:
        saved[key] = str(save(reader, ext, data))
        if log:
            log("finding %s: %s (%s) -> %s" % (key, finding["detail"], finding.get("where"), saved[key]))


def _follow(proc, reader, ext, index, findings, saved, scratch, log):
    """Read the child's reports until it ends; returns (next index, whether the campaign is over)."""
    current = pathlib.Path(scratch) / "current"
    last = time.monotonic()
    done = False
    while True:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            last = time.monotonic()
            report = json.loads(line)
            index = max(index, report.get("tried", index))
            done = done or report.get("done", False)
            if "finding" in report:
                saved_input = pathlib.Path(scratch) / ("finding-%d" % report["finding"]["index"])
                _record(report["finding"], saved_input.read_bytes(), reader, ext, findings, saved, log)
                saved_input.unlink()
        elif time.monotonic() - last > HANG_SECONDS:
            proc.kill()
            proc.wait()
            return _died(current, {"kind": "hang", "detail": "no answer for %d s" % HANG_SECONDS, "where": ""},
                         reader, ext, findings, saved, log), False
    code = proc.wait()
    if code < 0 or code not in (0, 3):
        return _died(current, {"kind": "crash", "detail": "the child ended with %d" % code, "where": str(code)},
                     reader, ext, findings, saved, log), False
    return index, done or code == 0


def _died(current, finding, reader, ext, findings, saved, log):
    if not current.exists():
        raise RuntimeError("the fuzz child for %s died before its first input (%s)" % (reader, finding["detail"]))
    raw = current.read_bytes()
    finding["index"] = int.from_bytes(raw[:8], "little")
    _record(finding, raw[8:], reader, ext, findings, saved, log)
    return finding["index"] + 1


def replay(reader, input_seconds=None, max_mb=None):
    """Every saved regression input of `reader`, run in this process: [(path, finding)] of those that fail."""
    from tests.fuzz.harnesses import HARNESSES
    config = settings()
    harness = HARNESSES[reader]
    failed = []
    with tempfile.TemporaryDirectory(prefix="pcd-replay-") as scratch:
        (pathlib.Path(scratch) / "seeds").mkdir()
        harness.seeds(pathlib.Path(scratch) / "seeds")        # the harness's fixed files (nets, folders)
        for path in regression_inputs(reader):
            finding = run_one(harness, path.read_bytes(), pathlib.Path(scratch) / "input",
                              input_seconds or config["input_seconds"], max_mb or config["max_mb"])
            if finding is not None:
                failed.append((path, finding))
    return failed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plain", "atheris"):        # a campaign's child process, by engine
        c = sub.add_parser(name)
        c.add_argument("reader")
        c.add_argument("--seed", default="0")
        c.add_argument("--start", type=int, default=0)
        c.add_argument("--seconds", type=float, required=True)
        c.add_argument("--input-seconds", type=float, default=2.0)
        c.add_argument("--max-mb", type=int, default=512)
        c.add_argument("--scratch", required=True)
        c.add_argument("--exclude", default="", help="regression inputs (file names) to leave out of the pool")
    f = sub.add_parser("fuzz", help="run campaigns and print what they found")
    f.add_argument("readers", nargs="*")
    f.add_argument("--seconds", type=float)
    f.add_argument("--seed")
    args = parser.parse_args(argv)
    if args.command in ("plain", "atheris"):
        run = child if args.command == "plain" else child_atheris
        return run(args.reader, args.seed, args.start, args.seconds, args.input_seconds, args.max_mb, args.scratch,
                   set(filter(None, args.exclude.split(","))))
    from tests.fuzz.harnesses import HARNESSES
    for reader in args.readers or HARNESSES:
        result = campaign(reader, args.seconds, args.seed, log=lambda line: print("  " + line, flush=True))
        print("%s: %d inputs in %.0f s, %d findings (%d distinct)"
              % (reader, result["tried"], result["seconds"], len(result["findings"]), len(result["saved"])),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
