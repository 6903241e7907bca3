"""Emulated network links (distributed/links.py): the RATE:DELAY spec, links that are really shaped (the rate each
way, a round trip of twice the delay), nothing left behind after close() or a failure half way, and
`train --workers 2 --link` running its workers in the namespaces (Sandblaster's workers and a pipeline's stages
too). The tests that make namespaces are skipped, with
the reason, where this machine cannot make them; on a kernel without netem the delay is 0 (tbf shapes the rate)
and the round-trip test is skipped."""
import json
import os
import re
import secrets
import socket
import subprocess
import sys
import threading
import time

import pytest

from pycaffe_dist.cli import main
from pycaffe_dist.distributed import links
from pycaffe_dist.distributed.links import EmulatedLinks, LinkSpec, parse_link
from pycaffe_dist.errors import PycaffeDistError
from tests.cli.commands import assert_clean_error, dist_caffe

RATE = 100 * 10 ** 6                    # 100mbit
DELAY_MS = 2
SIZE = 4 << 20                          # 4 MB: 0.34 s at 100mbit


# --- the spec --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, rate, delay_us", [
    ("1gbit:0.2ms", 10 ** 9, 200), ("100mbit:2ms", 10 ** 8, 2000), ("500kbit:300us", 500 * 10 ** 3, 300),
    ("2.5Gbit:0ms", 25 * 10 ** 8, 0), (" 10mbit : 1.5ms ", 10 ** 7, 1500)])
def test_a_spec_gives_the_rate_and_the_one_way_delay(text, rate, delay_us):
    spec = parse_link(text)
    assert (spec.rate_bit, spec.delay_us) == (rate, delay_us)
    assert parse_link(spec) is spec


@pytest.mark.parametrize("text", ["100mbit", "100:2ms", "100mb:2ms", "100mbps:2ms", "1gbit:2", "1gbit:2s",
                                  "fast:2ms", "1gbit:-1ms", "-1gbit:1ms", "1gbit:1ms:1", "", "0mbit:1ms",
                                  "1gbit:20000ms"])
def test_a_bad_spec_is_one_line_saying_what_was_expected(text):
    with pytest.raises(PycaffeDistError) as info:
        parse_link(text)
    message = str(info.value)
    assert "\n" not in message and repr(text) in message
    assert "expected RATE:DELAY" in message and "kbit, mbit or gbit" in message and "ms or us" in message
    assert "1gbit:0.2ms" in message


def test_the_hosts_and_the_rights_are_checked_first(monkeypatch):
    with pytest.raises(PycaffeDistError, match="between 1 and 250 worker hosts, not 0"):
        EmulatedLinks(0, "1gbit:1ms")
    monkeypatch.setattr(links.os, "geteuid", lambda: 1000)
    with pytest.raises(PycaffeDistError, match=r"^emulated links need root .*run as root, or without --link$"):
        EmulatedLinks(2, "1gbit:1ms")
    monkeypatch.setattr(links.os, "geteuid", lambda: 0)
    monkeypatch.setattr(links.shutil, "which", lambda *a, **k: None)
    with pytest.raises(PycaffeDistError, match="need ip and tc from iproute2"):
        EmulatedLinks(2, "1gbit:1ms")


def test_train_checks_link_before_starting_anything(make_solver):
    solver = make_solver(max_iter=10)
    assert_clean_error(dist_caffe("train", "--solver", solver, "--link", "1gbit:1ms"), "--link", "--workers N")
    assert_clean_error(dist_caffe("train", "--solver", solver, "--workers", 2, "--link", "1gbit"),
                       "bad link '1gbit': expected RATE:DELAY")
    assert_clean_error(dist_caffe("train", "--solver", solver, "--workers", 2, "--link", "1gbit:1ms", "--redis",
                                  "redis://127.0.0.1:1"), "no --redis with it")


def test_without_root_train_says_so_in_one_line_before_starting_anything(make_solver, monkeypatch, capsys):
    monkeypatch.setattr(links.os, "geteuid", lambda: 1000)
    started = []
    monkeypatch.setattr("pycaffe_dist.distributed.launch.LocalRedis", lambda *a, **k: started.append(a))
    code = main(["train", "--solver", str(make_solver(max_iter=10)), "--workers", "2", "--link", "100mbit:2ms"])
    err = capsys.readouterr().err
    assert code == 1 and not started
    assert err.strip().splitlines() == ["dist_caffe: error: emulated links need root (network namespaces, veths and "
                                        "tc qdiscs are root's to make): run as root, or without --link"]


# --- real links ------------------------------------------------------------------------------------------------

def _ours():
    """Every namespace and root-namespace interface of the links' naming on this machine."""
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    names += [line.split(":")[1].strip().split("@")[0] for line in
              subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout.splitlines()]
    return {name for name in names if name.startswith(links.NAME_PREFIX)}


@pytest.fixture(scope="module")
def delay_ms():
    """The delay the links here can have: DELAY_MS with netem, 0 on a kernel without it (tbf alone); a skip with
    the reason where no links can be made."""
    try:
        EmulatedLinks(1, "100mbit:%dms" % DELAY_MS).close()
        return DELAY_MS
    except PycaffeDistError as exc:
        if "no netem qdisc" not in str(exc):
            pytest.skip(str(exc))
    try:
        EmulatedLinks(1, "100mbit:0ms").close()
    except PycaffeDistError as exc:
        pytest.skip(str(exc))
    return 0


# Run in a worker's namespace: connect to the hub's server, 5 ping-pongs, send SIZE bytes, receive SIZE bytes.
CLIENT = r"""
import json, socket, sys, time
host, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
start = time.monotonic()
s = socket.create_connection((host, port), timeout=30)
connect = time.monotonic() - start
rtts = []
for _ in range(5):
    t = time.monotonic(); s.sendall(b"p"); s.recv(1); rtts.append(time.monotonic() - t)
s.sendall(b"u" * size)
s.shutdown(socket.SHUT_WR)
got, first = 0, None
while True:
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    first = first or time.monotonic()
    got += len(chunk)
print(json.dumps({"connect_s": connect, "rtt_s": min(rtts), "down_s": time.monotonic() - first, "down": got}))
"""


def _transfer(link, i):
    """Through link i: the upload and download rates (bit/s) of SIZE bytes, the connect time and the shortest of 5
    round trips (s), as a client in the namespace and a server at the hub measure them."""
    server = socket.create_server((link.hub, 0))
    measured = {}

    def serve():
        conn, _ = server.accept()
        with conn:
            for _ in range(5):
                conn.recv(1)
                conn.sendall(b"p")
            got, first = 0, None
            while True:
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                first = first or time.monotonic()
                got += len(chunk)
            measured["up"] = got * 8 / (time.monotonic() - first)
            conn.sendall(b"d" * SIZE)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with server:
        client = subprocess.run(link.prefix(i) + [sys.executable, "-c", CLIENT, link.hub,
                                                  str(server.getsockname()[1]), str(SIZE)],
                                capture_output=True, text=True, timeout=60)
        thread.join(30)
    assert client.returncode == 0, client.stderr
    result = json.loads(client.stdout)
    assert result["down"] == SIZE
    return dict(result, up=measured["up"], down=SIZE * 8 / result["down_s"])


@pytest.mark.slow
def test_each_direction_has_the_rate(delay_ms):
    with EmulatedLinks(2, "100mbit:%dms" % delay_ms) as link:
        assert link.spec == LinkSpec(RATE, 1000 * delay_ms, "100mbit:%dms" % delay_ms)
        # both ends of the veth carry the shaping
        outside = subprocess.run(["tc", "qdisc", "show", "dev", link.outside[1]], capture_output=True, text=True)
        inside = subprocess.run(link.prefix(1) + ["tc", "qdisc", "show", "dev", link.inside[1]],
                                capture_output=True, text=True)
        for shown in (outside.stdout, inside.stdout):
            assert "tbf" in shown and "rate 100Mbit" in shown, shown
            assert ("netem" in shown) == bool(delay_ms), shown
        # worker 1's namespace has its own address, and the hub is the only way out
        assert link.address(1) not in (link.hub, link.address(0))
        routes = subprocess.run(link.prefix(1) + ["ip", "-4", "route"], capture_output=True, text=True).stdout
        assert "default" not in routes and link.hub.rsplit(".", 1)[0] in routes
        measured = _transfer(link, 1)
    # TCP/IP headers take about 4% of each frame: 4 MB at 100mbit takes at least 0.34 s each way.
    for direction in ("up", "down"):
        assert 0.7 * RATE < measured[direction] < 1.0 * RATE, measured
    assert not link.leftovers()


@pytest.mark.slow
def test_a_round_trip_takes_twice_the_delay(delay_ms):
    if not delay_ms:
        pytest.skip("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): links without a delay only")
    with EmulatedLinks(1, "1gbit:%dms" % delay_ms) as link:
        measured = _transfer(link, 0)
    two_ways = 2 * delay_ms / 1000
    # the TCP handshake's SYN and SYN-ACK each cross the link once; so do a ping and its pong
    assert two_ways <= measured["connect_s"] < two_ways + 0.5, measured
    assert two_ways <= measured["rtt_s"] < two_ways + 0.5, measured


@pytest.mark.slow
def test_close_leaves_nothing_and_may_be_called_again(delay_ms):
    link = EmulatedLinks(3, "1gbit:%dms" % delay_ms)
    names = set(link.namespaces) | set(link.outside) | {link.bridge}
    assert len(names) == 7 and all(len(name) <= 15 for name in set(link.outside) | {link.bridge})
    assert names <= _ours()
    other = EmulatedLinks(1, "1gbit:%dms" % delay_ms)        # several at once: their own names and subnets
    assert other.tag != link.tag and other.hub != link.hub
    assert link.close() == [] and other.close() == []
    assert not (names | {other.bridge}) & _ours()
    assert link.close() == []


@pytest.mark.slow
def test_a_failure_half_way_takes_down_what_was_made(delay_ms, monkeypatch):
    tag = secrets.token_hex(3)
    monkeypatch.setattr(links.secrets, "token_hex", lambda n: tag)
    # tc refuses the first shaping, after the bridge, a namespace and a veth pair were made
    monkeypatch.setattr(links, "_tbf_args", lambda rate: ["tbf", "rate", "no-such-rate"])
    with pytest.raises(PycaffeDistError) as info:
        EmulatedLinks(2, "100mbit:0ms")
    message = str(info.value)
    assert message.startswith("emulated links: `tc ") and "no-such-rate" in message and "\n" not in message
    assert not [name for name in _ours() if tag in name]


# --- a job over links ------------------------------------------------------------------------------------------

def _running(pattern):
    result = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return [int(p) for p in result.stdout.split()]


@pytest.mark.slow
@pytest.mark.redis
def test_train_runs_each_worker_in_its_namespace_and_leaves_nothing(delay_ms, make_solver, tmp_path):
    env = dict(os.environ)
    env.pop("PCD_REDIS_PASSWORD", None)
    job = "links-" + secrets.token_hex(3)
    proc = subprocess.run([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(make_solver(max_iter=300)),
                           "--workers", "2", "--mode", "async", "--iterations", "60", "--job", job,
                           "--link", "100mbit:%dms" % delay_ms, "--stats", str(tmp_path / "stats.json")],
                          capture_output=True, text=True, env=env, timeout=120)
    out = proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Optimization Done after 60 merges." in out
    found = re.search(r"^\[links\] 2 worker host\(s\) in network namespaces (pcdl-(\w+)-w0)\.\.1, each on a link "
                      r"of 100mbit each way and (?:no delay|%dms one-way delay) to the hub ([\d.]+); Redis and the "
                      r"master are at the hub$" % delay_ms, out, re.M)
    assert found, out[:3000]
    tag, hub = found.group(2), found.group(3)
    assert "job %s on redis://%s:" % (job, hub) in out          # the master reaches Redis at the hub's address
    # each worker joined from its own namespace's address, on the hub's subnet
    joined = dict(re.findall(r"Worker (\d) joined from \S+ at ([\d.]+) \(pid", out))
    subnet = hub.rsplit(".", 1)[0] + "."
    assert sorted(joined) == ["0", "1"] and len(set(joined.values())) == 2, out[-3000:]
    assert all(a.startswith(subnet) and a != hub for a in joined.values()), joined
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["count"] == 60
    assert not [name for name in _ours() if tag in name]
    assert not _running("--job " + job)


@pytest.mark.slow
@pytest.mark.redis
def test_a_sigterm_of_train_still_takes_the_links_down(delay_ms, make_solver, tmp_path):
    env = dict(os.environ)
    env.pop("PCD_REDIS_PASSWORD", None)
    job = "links-" + secrets.token_hex(3)
    proc = subprocess.Popen([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(make_solver(max_iter=300)),
                             "--workers", "2", "--iterations", str(10 ** 6), "--job", job,
                             "--link", "1gbit:%dms" % delay_ms], stderr=subprocess.PIPE, text=True, env=env)
    lines, tag = [], None
    try:
        deadline = time.monotonic() + 60
        for line in proc.stderr:
            lines.append(line)
            tag = tag or (re.findall(r"network namespaces pcdl-(\w+)-w0", line) or [None])[0]
            if "Starting: 2 worker(s)" in line or time.monotonic() > deadline:
                break
        assert tag and _ours() & {"pcdl-%s-w0" % tag, "pcdl-%s-w1" % tag}, "".join(lines)[-3000:]
        proc.terminate()
        out = "".join(lines) + proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + 15, out[-3000:]
    assert not [name for name in _ours() if tag in name]
    assert not _running("--job " + job)


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.parametrize("kind, flags, done, ready", [
    ("sandblaster", ["--workers", "2", "--mode", "sandblaster", "--iterations", "3"],
     "Optimization Done after 3 iterations", r"Worker (\d) ready on \S+ at ([\d.]+) \(pid"),
    ("pipeline", ["--pipeline", "2", "--iterations", "20"],
     "Optimization Done after 20 iterations.", r"Stage (\d) ready on \S+ at ([\d.]+) \(pid")])
def test_sandblaster_and_pipeline_jobs_run_over_links_too(delay_ms, make_solver, kind, flags, done, ready):
    """Their workers (stages) each in a namespace of its own, reaching Redis at the hub; nothing left after."""
    env = dict(os.environ)
    env.pop("PCD_REDIS_PASSWORD", None)
    job = "links-" + secrets.token_hex(3)
    proc = subprocess.run([sys.executable, "-m", "pycaffe_dist", "train", "--solver", str(make_solver(max_iter=300)),
                           "--job", job, "--link", "100mbit:%dms" % delay_ms] + flags,
                          capture_output=True, text=True, env=env, timeout=120)
    out = proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert done in out, out[-3000:]
    found = re.search(r"^\[links\] 2 worker host\(s\) in network namespaces pcdl-(\w+)-w0\.\.1, .* to the hub "
                      r"([\d.]+); Redis and the master are at the hub$", out, re.M)
    assert found, out[:3000]
    tag, hub = found.groups()
    joined = dict(re.findall(ready, out))
    subnet = hub.rsplit(".", 1)[0] + "."
    assert sorted(joined) == ["0", "1"] and len(set(joined.values())) == 2, out[-3000:]
    assert all(a.startswith(subnet) and a != hub for a in joined.values()), joined
    assert not [name for name in _ours() if tag in name]
    assert not _running("--job " + job)
