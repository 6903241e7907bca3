"""Emulated network links for a job on one machine: each worker host is a network namespace, joined to a hub by
its own shaped link, so that a distributed job meets a network's bandwidth and latency without several machines.

The hub is a Linux bridge in the root namespace with an address: Redis and the master stay in the root namespace
and are reached at that address, as when Redis runs on the master's host. Each worker namespace is joined to the
bridge by a veth pair, and both ends of the pair are shaped (the namespace's end shapes what the worker sends, the
bridge's end what it receives), so each direction has the link's rate and its one-way delay, and a round trip
takes twice the delay. The shaping on each end is a netem qdisc for the delay with a tbf qdisc under it for the
rate (the netem documentation's recipe): tbf is in more kernels than netem (some have tbf but no netem, this
project's VM among them), so a link with a delay of 0 needs no netem at all, and the rate is shaped the same way
whether or not there is a delay, and tested where netem is missing.

Needs root, `ip` and `tc` (iproute2) and a kernel with network namespaces, bridges, veth and the qdiscs; where one
is missing, EmulatedLinks says which in one line. Every name carries a random tag (several sets of links can exist
at once) and close() removes the namespaces, veths and the bridge, whatever happened before.
"""
import ipaddress
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass

from ..errors import PycaffeDistError

log = logging.getLogger("pycaffe_dist.distributed")

NAME_PREFIX = "pcdl"            # every namespace and interface of ours starts with it
MAX_HOSTS = 250                 # worker addresses .2 to .251 of a /24, the hub being .1
RATE_UNITS = {"kbit": 10 ** 3, "mbit": 10 ** 6, "gbit": 10 ** 9}        # tc's: decimal, in bits per second
DELAY_UNITS = {"ms": 1000, "us": 1}                                     # to microseconds
SPEC_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(kbit|mbit|gbit)\s*:\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|us)\s*$",
                     re.IGNORECASE)
EXPECTED = ("expected RATE:DELAY, a rate in kbit, mbit or gbit and a one-way delay in ms or us, e.g. 1gbit:0.2ms "
            "or 100mbit:2ms")
MAX_DELAY_US = 10 * 10 ** 6


@dataclass(frozen=True)
class LinkSpec:
    """One link's shape: its rate in each direction (bits per second) and its one-way delay (microseconds)."""
    rate_bit: int
    delay_us: int
    text: str

    def describe(self):
        delay = "%s one-way delay" % _delay_text(self.delay_us) if self.delay_us else "no delay"
        return "%s each way and %s" % (_rate_text(self.rate_bit), delay)


def parse_link(text):
    """A LinkSpec from `RATE:DELAY` (`1gbit:0.2ms`, `100mbit:2ms`, `500kbit:300us`); PycaffeDistError otherwise."""
    if isinstance(text, LinkSpec):
        return text
    match = SPEC_RE.match(str(text))
    if match is None:
        raise PycaffeDistError("bad link %r: %s" % (text, EXPECTED))
    rate = float(match.group(1)) * RATE_UNITS[match.group(2).lower()]
    delay = float(match.group(3)) * DELAY_UNITS[match.group(4).lower()]
    if rate < 1000:
        raise PycaffeDistError("bad link %r: the rate must be at least 1kbit (%s)" % (text, EXPECTED))
    if delay > MAX_DELAY_US:
        raise PycaffeDistError("bad link %r: a delay of at most 10000ms (%s)" % (text, EXPECTED))
    return LinkSpec(int(round(rate)), int(round(delay)), str(text).strip())


def _rate_text(bits):
    for unit, size in sorted(RATE_UNITS.items(), key=lambda kv: -kv[1]):
        if bits >= size:
            return "%g%s" % (bits / size, unit)
    return "%dbit" % bits


def _delay_text(us):
    return "%gms" % (us / 1000) if us >= 1000 else "%dus" % us


def _tbf_args(rate_bit):
    """tbf's rate, burst and queue: a burst of 1 ms of traffic (at least a few full frames, as tbf drops a frame
    larger than its burst) and a queue of 100 ms of traffic (at least 256 KB), deep enough that TCP's pacing, not
    the queue's drops, sets a transfer's speed."""
    rate_bytes = rate_bit // 8
    burst = max(rate_bytes // 1000, 4 * 1514)
    limit = max(rate_bytes // 10, 256 * 1024) + burst
    return ["tbf", "rate", "%dbit" % rate_bit, "burst", str(burst), "limit", str(limit)]


class EmulatedLinks:
    """`hosts` worker namespaces, each joined to the hub (a bridge in the root namespace at `hub`) by a link shaped
    as `spec` (a LinkSpec or its text) in both directions. `prefix(i)`: the argv prefix that runs a command on
    host i; `address(i)`: host i's address. A context manager; close() removes everything."""

    def __init__(self, hosts, spec):
        self.spec = parse_link(spec)
        if not 1 <= hosts <= MAX_HOSTS:
            raise PycaffeDistError("emulated links: between 1 and %d worker hosts, not %d" % (MAX_HOSTS, hosts))
        self.ip, self.tc = _tools()
        self.tag = self._free_tag()
        self.bridge = "%s%sb" % (NAME_PREFIX, self.tag)
        self.namespaces = ["%s-%s-w%d" % (NAME_PREFIX, self.tag, i) for i in range(hosts)]
        # interface names have at most 15 characters: pcdl + 6 + h/w + up to 3 digits
        self.outside = ["%s%sh%d" % (NAME_PREFIX, self.tag, i) for i in range(hosts)]      # on the bridge
        self.inside = ["%s%sw%d" % (NAME_PREFIX, self.tag, i) for i in range(hosts)]       # in the namespace
        self.closed = False
        try:
            self.subnet = self._free_subnet()
            hosts_of = list(self.subnet.hosts())
            self.hub = str(hosts_of[0])
            self.addresses = [str(hosts_of[1 + i]) for i in range(hosts)]
            self._create()
        except BaseException:
            # any failure or a Ctrl-C half way: take down what was made
            self.close()
            raise

    # --- what the launcher uses ------------------------------------------------------------------------------------

    def prefix(self, i):
        return [self.ip, "netns", "exec", self.namespaces[i]]

    def address(self, i):
        return self.addresses[i]

    def describe(self):
        names = self.namespaces[0] if len(self.namespaces) == 1 else "%s..%d" % (self.namespaces[0],
                                                                                 len(self.namespaces) - 1)
        return "%d worker host(s) in network namespaces %s, each on a link of %s to the hub %s" % (
            len(self.namespaces), names, self.spec.describe(), self.hub)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- making them ---------------------------------------------------------------------------------------------

    def _create(self):
        self._ip("link", "add", self.bridge, "type", "bridge")
        self._ip("addr", "add", "%s/%d" % (self.hub, self.subnet.prefixlen), "dev", self.bridge)
        self._ip("link", "set", self.bridge, "up")
        for i, ns in enumerate(self.namespaces):
            outside, inside = self.outside[i], self.inside[i]
            self._ip("netns", "add", ns)
            self._ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self._ip("link", "set", inside, "netns", ns)
            self._ip("link", "set", outside, "master", self.bridge)
            self._ip("link", "set", outside, "up")
            self._ip("-n", ns, "addr", "add", "%s/%d" % (self.addresses[i], self.subnet.prefixlen), "dev", inside)
            self._ip("-n", ns, "link", "set", inside, "up")
            self._ip("-n", ns, "link", "set", "lo", "up")       # a worker's own loopback (some libraries use it)
            self._shape([], outside)                            # hub -> worker: what the worker receives
            self._shape(["-n", ns], inside)                     # worker -> hub: what the worker sends

    def _shape(self, where, device):
        if self.spec.delay_us:
            self._tc(*where, "qdisc", "add", "dev", device, "root", "handle", "1:", "netem", "delay",
                     "%dus" % self.spec.delay_us)
            self._tc(*where, "qdisc", "add", "dev", device, "parent", "1:1", "handle", "10:",
                     *_tbf_args(self.spec.rate_bit))
        else:
            self._tc(*where, "qdisc", "add", "dev", device, "root", "handle", "1:", *_tbf_args(self.spec.rate_bit))

    def _free_tag(self):
        """A random tag that no existing namespace or interface of this machine has."""
        existing = self._existing_names()
        for _ in range(20):
            tag = secrets.token_hex(3)
            if not any(tag in name for name in existing):
                return tag
        raise PycaffeDistError("emulated links: no free name found")

    def _free_subnet(self):
        """A /24 in 10.128.0.0/9 that overlaps none of this machine's addresses and routes."""
        taken = []
        for args in (["-4", "-o", "addr", "show"], ["-4", "route", "show", "table", "all"]):
            for line in self._run(self.ip, *args).splitlines():
                for word in line.split():
                    try:
                        taken.append(ipaddress.ip_network(word, strict=False))
                    except ValueError:
                        continue
        taken = [net for net in taken if net.prefixlen > 0]     # not the default route
        for _ in range(100):
            subnet = ipaddress.ip_network("10.%d.%d.0/24" % (128 + secrets.randbelow(127), secrets.randbelow(256)))
            if not any(subnet.overlaps(net) for net in taken):
                return subnet
        raise PycaffeDistError("emulated links: no free /24 subnet found in 10.128.0.0/9")

    # --- removing them -------------------------------------------------------------------------------------------

    def close(self):
        """Remove the veths, namespaces and the bridge (those that exist: it runs after a failure half way too);
        returns the names still there (none, unless the kernel refused), after a warning naming them."""
        if self.closed:
            return []
        # A Ctrl-C now would leave root-owned namespaces behind: the ip commands and we ignore it meanwhile
        # (an ignored signal stays ignored in the children).
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            existing = self._existing_names()
            for outside, ns in zip(self.outside, self.namespaces):
                # deleting one end of a veth deletes both; a namespace's own destruction runs later in the kernel,
                # so the veth goes first, explicitly
                if outside in existing:
                    self._try(self.ip, "link", "del", outside)
                if ns in existing:
                    self._try(self.ip, "netns", "del", ns)
            if self.bridge in existing:
                self._try(self.ip, "link", "del", self.bridge)
            self.closed = True
            left = self.leftovers()
            if left:
                log.warning("emulated links: could not remove %s (remove them with `ip netns del` and "
                            "`ip link del`)", ", ".join(left))
            return left
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def leftovers(self):
        """Our namespaces and interfaces that exist now."""
        mine = set(self.namespaces) | set(self.outside) | {self.bridge}
        return sorted(mine & self._existing_names())

    def _existing_names(self):
        """Every network namespace and root-namespace interface name on this machine starting with NAME_PREFIX."""
        names = set()
        for line in self._run(self.ip, "netns", "list").splitlines():
            if line.split():
                names.add(line.split()[0])
        for line in self._run(self.ip, "-o", "link", "show").splitlines():
            parts = line.split(":")
            if len(parts) > 1:
                names.add(parts[1].strip().split("@")[0])
        return {name for name in names if name.startswith(NAME_PREFIX)}

    # --- commands ------------------------------------------------------------------------------------------------

    def _ip(self, *args):
        self._run(self.ip, *args)

    def _tc(self, *args):
        self._run(self.tc, *args)

    @staticmethod
    def _run(*argv):
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PycaffeDistError("emulated links: `%s` failed: %s" % (" ".join(argv), exc)) from None
        if done.returncode:
            raise PycaffeDistError("emulated links: %s" % _explain(argv, done.stderr))
        return done.stdout

    @staticmethod
    def _try(*argv):
        subprocess.run(list(argv), capture_output=True, timeout=30, stdin=subprocess.DEVNULL)


def _tools():
    """The paths of ip and tc; PycaffeDistError saying why links cannot be made here."""
    if os.geteuid() != 0:
        raise PycaffeDistError("emulated links need root (network namespaces, veths and tc qdiscs are root's to "
                               "make): run as root, or without --link")
    found = [shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin") for tool in ("ip", "tc")]
    missing = [tool for tool, path in zip(("ip", "tc"), found) if path is None]
    if missing:
        raise PycaffeDistError("emulated links need %s from iproute2 (not found on the PATH): install iproute2"
                               % " and ".join(missing))
    return found


def _explain(argv, stderr):
    """One line on why a command failed, naming the kernel feature where its error shows one is missing."""
    message = " ".join(stderr.split()) or "failed"
    command = " ".join([os.path.basename(argv[0])] + list(argv[1:]))
    if "qdisc kind is unknown" in message:
        kind = "netem" if "netem" in argv else "tbf"
        config = {"netem": "CONFIG_NET_SCH_NETEM", "tbf": "CONFIG_NET_SCH_TBF"}[kind]
        hint = " (a link with a delay of 0, e.g. 100mbit:0ms, needs only tbf)" if kind == "netem" else ""
        return "this kernel has no %s qdisc (%s), needed to emulate the link's %s%s" % (
            kind, config, "delay" if kind == "netem" else "rate", hint)
    if "type" in argv and ("Unknown device type" in message or "not supported" in message.lower()):
        kind = argv[list(argv).index("type") + 1]
        return "this kernel cannot make a %s interface (`%s`: %s)" % (kind, command, message)
    return "`%s`: %s" % (command, message)
