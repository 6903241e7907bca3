"""The data-parallel master's workers: who joined, who is ready, who is gone, which data slot each holds, when each
was last heard from, and what each did (images, rounds, the time it computed and the time it waited)."""
import time


class Member:
    def __init__(self, worker, slot, info):
        self.id, self.slot, self.info = worker, slot, info
        self.last_round = None
        self.images = self.rounds = 0
        self.compute_s = self.wait_s = 0.0
        self.first_seen = self.last_heard = time.monotonic()
        self.silent = False                     # said to have gone silent (and not heard from since)

    def count_round(self, message):
        """A round of this worker's merged or dropped: what it did in it."""
        self.images += message.get("images", 0)
        self.rounds += 1
        self.compute_s += message.get("compute_s", 0.0)
        self.wait_s += message.get("wait_s", 0.0)

    def usual_round_s(self):
        return (self.compute_s + self.wait_s) / self.rounds if self.rounds else 0.0


class Membership:
    """`members`: the ready workers (the rule's); `pending`: those that joined and are not ready yet."""

    def __init__(self):
        self.members, self.pending = {}, {}
        self.slots = {}                         # worker -> the data slot it was last given
        self.alone_since = None                 # when the last worker left a started job

    def __len__(self):
        return len(self.members)

    def ids(self):
        """Every worker the master knows: members, then those pending."""
        return list(self.members) + list(self.pending)

    def knows(self, worker):
        return worker in self.members or worker in self.pending

    def sorted_members(self):
        return sorted(self.members, key=int)

    def slot(self, worker):
        return self.members[worker].slot

    def admit(self, worker, message):
        """A join: the worker is pending, with a data slot (its last one again where that is free)."""
        taken = {m.slot for m in list(self.members.values()) + list(self.pending.values())}
        slot = self.slots.get(worker)
        if slot is None or slot in taken:
            slot = next(i for i in range(len(taken) + 1) if i not in taken)
        self.slots[worker] = slot
        info = {"host": message.get("host", "?"), "pid": message.get("pid", 0), "slot": slot}
        if message.get("address"):
            info["address"] = message["address"]
        self.pending[worker] = member = Member(worker, slot, info)
        self.alone_since = None                 # (a job left without workers has one again)
        return member

    def make_ready(self, worker):
        """A pending worker is a member now (returned); None when it was not pending."""
        member = self.pending.pop(worker, None)
        if member is not None:
            self.members[worker] = member
            self.heard(member)
            self.alone_since = None
        return member

    def restore(self, known, alive):
        """After a restart: the workers of `known` (id -> info, from Redis) that are `alive` are members again."""
        for worker in sorted(known, key=int):
            if alive(worker):
                self.members[worker] = Member(worker, int(known[worker].get("slot", 0)), known[worker])

    def remove(self, worker):
        """Forget a worker: True where it was a member (the rule must hear of it), False where it was pending or
        unknown."""
        if self.pending.pop(worker, None) is not None:
            return False
        return self.members.pop(worker, None) is not None

    def left_alone(self, started):
        """Whether the last worker of a started job just left (the time is kept: alone_since)."""
        if started and not self.members and not self.pending and self.alone_since is None:
            self.alone_since = time.monotonic()
            return True
        return False

    def heard(self, member):
        """A message with something new from `member` (a re-send is not: a worker that only sends those is stuck,
        and is named as such); True where it had been said to be silent."""
        member.last_heard = time.monotonic()
        was, member.silent = member.silent, False
        return was

    def gone_silent(self, now, heartbeat_s):
        """The members newly silent: nothing new from them for 3 heartbeats, or 5 of their usual rounds."""
        silent = []
        for member in self.members.values():
            if not member.silent and now - member.last_heard > max(3 * heartbeat_s, 5 * member.usual_round_s()):
                member.silent = True
                silent.append(member)
        return silent

    # --- reporting -----------------------------------------------------------------------------------------------

    def exchange_share(self):
        """The share of the workers' rounds spent waiting for the exchange (pushing, the reply, pulling)."""
        compute = sum(m.compute_s for m in self.members.values())
        wait = sum(m.wait_s for m in self.members.values())
        return wait / (compute + wait) if compute + wait else 0.0

    def rates(self, started_at):
        """worker -> its images per second since it joined (or since the start)."""
        now = time.monotonic()
        return {m.id: m.images / max(1e-9, now - max(m.first_seen, started_at)) for m in self.members.values()}

    def images(self):
        return sum(m.images for m in self.members.values())
