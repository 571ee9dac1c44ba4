"""The engine under a simulated rank's calls: posting, matching, moving the data, completing.

Each rank has one :class:`Calls` (``rank.world_calls``); :class:`refconv.simulated.comm.Comm`
hands it every call.  All of it runs under the world's lock:

- a **collective** is the n-th collective of its rank on its communicator; it waits in slot n
  until every member has posted its n-th, and the last one moves the data for all (:data:`FIRE`);
- a **send** is matched with the oldest posted receive of its destination that names its source
  (or ``ANY_SOURCE``) and tag (or ``ANY_TAG``) on the same communicator, and a receive with the
  oldest such send: MPI's order, so messages between two ranks do not overtake each other;
- a **wait** blocks (:meth:`refconv.simulated.world.World.block`) until the requests are done,
  then checks that their buffers were left alone and, on a priced run, moves the rank's clock
  to when their data arrived (:mod:`refconv.simulated.clock`).
"""

import pickle

from mpi4py import MPI

from refconv.simulated.comm import Comm, Group, Post, Request, carried, mismatch, reduction


class Calls:
    """One rank's side of the engine."""

    def __init__(self, world, me):
        self.world, self.me = world, me

    # -- posting -----------------------------------------------------------------------------------------
    def collective(self, comm, op, agree, args):
        group, r = comm.group, comm.rank
        with self.world.lock:
            n = group.posted[r]
            request = Request(self.me, f"{op} (collective {n}) on communicator {group.name!r}")
            self.world.check(self.me, request.what)
            group.posted[r] += 1
            post = Post(r, op, agree, request, args)
            request.payload = args.get("payload")
            for role in ("send", "recv", "buf"):
                if args.get(role) is not None and (role != "recv" or args["recv"] is not args.get("send")):
                    request.watch(args[role], "send" if role == "send" else "receive" if role == "recv" else "broadcast")
            slot = group.slots.setdefault(n, {})
            first = next(iter(slot.values()), None)
            if first is not None and (first.call != op or first.agree != agree):
                raise mismatch(group, n, list(slot.values()) + [post])
            slot[r] = post
            if self.me.clock is not None:
                self.me.clock.posted(post, comm)
            if len(slot) == len(group.members):
                del group.slots[n]
                posts = [slot[i] for i in range(len(group.members))]
                for p in posts:
                    p.request.moving()
                FIRE[op](group, posts, self.world)
                if self.me.clock is not None:
                    self.me.clock.collective_done(group, posts)
                for p in posts:
                    p.request.delivered()
                self.world.notify([p.request.owner for p in posts])
        self.world.switch(self.me)
        return request

    def send(self, comm, array, dest, tag):
        request = Request(self.me, f"Isend to rank {dest} tag {tag} on communicator {comm.group.name!r}")
        message = Post(comm.rank, "send", (), request, dict(array=array, peer=dest, tag=tag))
        request.watch(array, "send")
        self._point_to_point(comm, message, comm.group.recvs, comm.group.sends, dest, _matches_send)
        return request

    def recv(self, comm, array, source, tag):
        peer = "any rank" if source == MPI.ANY_SOURCE else f"rank {source}"
        label = "any tag" if tag == MPI.ANY_TAG else f"tag {tag}"
        request = Request(self.me, f"Irecv from {peer} {label} on communicator {comm.group.name!r}")
        message = Post(comm.rank, "recv", (), request, dict(array=array, peer=source, tag=tag))
        request.watch(array, "receive")
        self._point_to_point(comm, message, comm.group.sends, comm.group.recvs, comm.rank, _matches_recv)
        return request

    def _point_to_point(self, comm, mine, theirs, queue, dest, matches):
        """Match ``mine`` against the calls pending for its message's destination ``dest`` only (a
        send: ``dest``'s receives; a receive: the sends to this rank), oldest first: O(those calls), not O(K)."""
        with self.world.lock:
            self.world.check(self.me, mine.request.what)
            if self.me.clock is not None:
                self.me.clock.posted(mine, comm)
            pending = theirs.get(dest, ())
            other = next((o for o in pending if matches(mine, o)), None)
            if other is None:
                queue.setdefault(dest, []).append(mine)
            else:
                pending.remove(other)
                send, recv = (mine, other) if mine.call == "send" else (other, mine)
                send.request.moving()
                recv.request.moving()
                _deliver(send, recv)
                if self.me.clock is not None:
                    self.me.clock.message_done(comm.group, send, recv)
                send.request.delivered()
                recv.request.delivered()
                self.world.notify([send.request.owner, recv.request.owner])
        self.world.switch(self.me)

    # -- completing ----------------------------------------------------------------------------------------
    def wait(self, requests):
        self._check_owner(requests, "Wait")
        self.world.block(self.me, lambda: all(r.done for r in requests), lambda: _pending(requests))
        self._complete(requests)
        self.world.switch(self.me)

    def test(self, requests):
        self._check_owner(requests, "Test")
        with self.world.lock:
            self.world.check(self.me, requests[0].what)
            done = all(r.done for r in requests)
            if done and self.me.clock is not None:
                done = self.me.clock.arrived(requests)
        if done:
            self._complete(requests)
        self.world.switch(self.me)
        return done

    def _complete(self, requests):
        for r in requests:
            error = r.error or r.verify("before its request completed")
            if error is not None:
                raise error
        if self.me.clock is not None:
            self.me.clock.waited(requests)

    def _check_owner(self, requests, call):
        for r in requests:
            if r.owner is not self.me:
                raise RuntimeError(f"{call}: rank {self.me.rank} completes a request of rank {r.owner.rank} ({r.what})")


def _pending(requests):
    """What a rank waits for: its calls not yet done, and what an object collective among them carries
    (a rank reporting a failure through one, as refconv.testing.asserts does, shows its message)."""
    waiting = [r for r in requests if not r.done] or requests[:1]
    return "; ".join(r.what for r in waiting) + "".join(carried(r.payload) for r in waiting)


def _matches_send(send, recv):
    """Does the posted receive ``recv`` take the new message ``send``?"""
    return recv.rank == send.args["peer"] and recv.args["peer"] in (send.rank, MPI.ANY_SOURCE) \
        and recv.args["tag"] in (send.args["tag"], MPI.ANY_TAG)


def _matches_recv(recv, send):
    return _matches_send(send, recv)


def _deliver(send, recv):
    data, into = send.args["array"], recv.args["array"]
    if data.nbytes > into.nbytes:
        raise ValueError(f"{recv.request.what}: the message of rank {send.rank} ({send.request.what}, {data.nbytes} bytes) "
                         f"is larger than the receive buffer ({into.nbytes} bytes): MPI truncates it, an error")
    if _shapes(recv.request.what, data, into):
        into.written()
        return
    into.reshape(-1).view("u1")[:data.nbytes] = data.reshape(-1).view("u1")


def _shapes(what, *arrays):
    """True when every array is shapes-only (nothing to move), False when none is; Mixed otherwise."""
    kinds = [getattr(a, "shapes_only", False) for a in arrays]
    if not any(kinds):
        return False
    if not all(kinds):
        from refconv.shapes.errors import Mixed
        raise Mixed(f"{what}: buffers of one call", arrays[kinds.index(True)], arrays[kinds.index(False)])
    return True


# -- the collectives, once every member has posted: posts[i] is comm rank i's ----------------------------------
def _allreduce(group, posts, world):
    if _shapes(posts[0].request.what, *(a for p in posts for a in (p.args["send"], p.args["recv"]))):
        for p in posts:                           # the sizes and dtypes agree (the posts' agreement)
            p.args["recv"].written()
        return
    ufunc = reduction(posts[0].args["op"])
    total = posts[0].args["send"].copy()
    for p in posts[1:]:                           # rank order: ((x_0 + x_1) + x_2) + ...
        ufunc(total, p.args["send"], out=total)
    for p in posts:
        p.args["recv"][...] = total


def _split(group, posts, world):
    colors = {}
    for p in posts:
        if p.args["color"] != MPI.UNDEFINED:
            colors.setdefault(p.args["color"], []).append((p.args["key"], p.rank))
    for color, members in colors.items():
        members.sort()
        new = Group(world, [group.members[r] for _, r in members], f"{group.name}/split {color}")
        for index, (_, r) in enumerate(members):
            owner = world.ranks[group.members[r]]
            posts[r].request.result = Comm(new, index, owner)
    for p in posts:
        if p.args["color"] == MPI.UNDEFINED:
            p.request.result = MPI.COMM_NULL


def _bcast(group, posts, world):
    root = posts[posts[0].args["root"]].args["buf"]
    if _shapes(posts[0].request.what, *(p.args["buf"] for p in posts)):
        for p in posts:
            if p.args["buf"] is not root:
                p.args["buf"].written()
        return
    for p in posts:
        if p.args["buf"] is not root:
            p.args["buf"].reshape(-1).view("u1")[...] = root.reshape(-1).view("u1")


def _bcast_object(group, posts, world):
    payload = posts[posts[0].args["root"]].args["payload"]
    for p in posts:
        p.request.result = pickle.loads(payload)    # each rank its own copy, as from a message


def _allgather_object(group, posts, world):
    for p in posts:
        p.request.result = [pickle.loads(q.args["payload"]) for q in posts]


def _blocks(group, posts, world):
    """Alltoallw, Alltoallv, Allgather: rank q's send block r goes to rank r's receive block q.  Only
    the blocks that carry bytes are read and written (``buffers.Blocks.nonempty``): O(those), not
    O(K^2) for K members, most of whose blocks are empty at scale.  A non-empty block meeting an
    empty one is the size mismatch it always was."""
    sends = [_nonempty(q.args["send_blocks"]) for q in posts]
    payloads = [{r: region.read() for r, region in s.items()} for s in sends]   # every read before a write
    for r, p in enumerate(posts):
        for q, region in _nonempty(p.args["recv_blocks"]).items():
            region.write(payloads[q].pop(r, _NOTHING))
    for q, left in enumerate(payloads):
        for r, payload in left.items():          # sent into an empty receive block: an error
            posts[r].args["recv_blocks"][q].write(payload)


class _Nothing:
    """What an empty send block carries into a non-empty receive block: no bytes (its write says so)."""
    size = 0


_NOTHING = _Nothing()


def _nonempty(regions):
    """``{rank: region}`` of the blocks that carry bytes (a ``buffers.Blocks`` knows them)."""
    known = getattr(regions, "nonempty", None)
    return known if known is not None else {r: region for r, region in enumerate(regions) if region.nbytes}


def _scatterv(group, posts, world):
    blocks = posts[posts[0].args["root"]].args["send_blocks"]
    payloads = [region.read() for region in blocks]
    for r, p in enumerate(posts):
        p.args["recv_region"].write(payloads[r])


def _gatherv(group, posts, world):
    root = posts[posts[0].args["root"]]
    payloads = [p.args["send_region"].read() for p in posts]
    for q, region in enumerate(root.args["recv_blocks"]):
        region.write(payloads[q])


FIRE = {"Allreduce": _allreduce, "Split": _split, "Barrier": lambda group, posts, world: None, "Bcast": _bcast,
        "bcast": _bcast_object, "allgather": _allgather_object, "Alltoallw": _blocks, "Alltoallv": _blocks,
        "Allgather": _blocks, "Scatterv": _scatterv, "Gatherv": _gatherv}
