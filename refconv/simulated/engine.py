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

from refconv.simulated import buffers
from refconv.simulated.comm import Comm, Group, Post, carried, mismatch
from refconv.simulated.request import Request, overlap
from refconv.simulated.world import InvalidParameter, PendingRequests, TypeMismatch, call_site


class Calls:
    """One rank's side of the engine."""

    def __init__(self, world, me):
        self.world, self.me = world, me
        self.pending = {}      # this rank's requests not yet completed (a dict: in posting order)
        self.schedule = getattr(world, "schedule", None)   # run(schedules="all"): refconv.simulated.schedules

    # -- posting -----------------------------------------------------------------------------------------
    def collective(self, comm, op, agree, args):
        group, r = comm.group, comm.rank
        call = args.pop("call", None)
        nonblocking = args.pop("poison", False)
        site = call_site() if nonblocking else None
        with self.world.lock:
            n = group.posted[r]
            request = Request(self.me, f"{op} (collective {n}) on communicator {group.name!r}", call or op, site)
            self.world.check(self.me, request.what)
            _claim(request, args, r)
            self._disjoint(request)
            group.posted[r] += 1
            post = Post(r, op, agree, request, args, name=call)
            request.payload = args.get("payload")
            if nonblocking and args.get("recv") is not None:
                request.poison(args["recv"])
            for role in ("send", "recv", "buf"):
                if args.get(role) is not None and (role != "recv" or args["recv"] is not args.get("send")):
                    request.watch(args[role], "send" if role == "send" else "receive" if role == "recv" else "broadcast")
            slot = group.slots.setdefault(n, {})
            first = next(iter(slot.values()), None)
            if first is not None and (first.name != post.name or first.agree != agree):   # Iallreduce never matches Allreduce
                raise mismatch(group, n, list(slot.values()) + [post])
            slot[r] = post
            self.pending[request] = None
            if self.me.clock is not None:
                self.me.clock.posted(post, comm)
            if len(slot) == len(group.members):
                del group.slots[n]
                posts = [slot[i] for i in range(len(group.members))]
                _check_types(group, op, posts)
                for p in posts:
                    p.request.moving()
                try:
                    FIRE[op](group, posts, self.world)
                except buffers.SizeMismatch as error:
                    raise _size_mismatch(group, op, posts, error) from None
                if self.me.clock is not None:
                    self.me.clock.collective_done(group, posts)
                for p in posts:
                    p.request.delivered()
                self.world.notify([p.request.owner for p in posts])
        self.world.switch(self.me)
        return request

    def send(self, comm, array, dest, tag, *, region=None, call="Isend", site=None):
        request = Request(self.me, f"{call} to rank {dest} tag {tag} on communicator {comm.group.name!r}", call, site)
        message = Post(comm.rank, "send", (), request, dict(array=array, peer=dest, tag=tag, region=region))
        request.watch(array, "send")
        request.claim(array, False, getattr(region, "view", None))
        self._point_to_point(comm, message, comm.group.recvs, comm.group.sends, dest, _matches_send)
        return request

    def recv(self, comm, array, source, tag, *, region=None, call="Irecv", site=None, poisoned=False):
        peer = "any rank" if source == MPI.ANY_SOURCE else f"rank {source}"
        label = "any tag" if tag == MPI.ANY_TAG else f"tag {tag}"
        request = Request(self.me, f"{call} from {peer} {label} on communicator {comm.group.name!r}", call, site)
        message = Post(comm.rank, "recv", (), request, dict(array=array, peer=source, tag=tag, region=region))
        if poisoned:
            request.poison(array)
        request.watch(array, "receive")
        request.claim(array, True, getattr(region, "view", None))
        self._point_to_point(comm, message, comm.group.sends, comm.group.recvs, comm.rank, _matches_recv)
        return request

    def null(self, comm, what, call, site):
        """A send to or receive from MPI.PROC_NULL: done at once, moving nothing; a receive's status says
        source PROC_NULL, tag ANY_TAG, count 0."""
        request = Request(self.me, f"{what} on communicator {comm.group.name!r}", call, site)
        request.status = (MPI.PROC_NULL, MPI.ANY_TAG, 0)
        request.done = True
        with self.world.lock:
            self.world.check(self.me, request.what)
            self.pending[request] = None
        self.world.switch(self.me)
        return request

    def _point_to_point(self, comm, mine, theirs, queue, dest, matches):
        """Match ``mine`` against the calls pending for its message's destination ``dest`` only (a
        send: ``dest``'s receives; a receive: the sends to this rank), oldest first: O(those calls), not O(K)."""
        with self.world.lock:
            self.world.check(self.me, mine.request.what)
            self._disjoint(mine.request)
            self.pending[mine.request] = None
            if self.me.clock is not None:
                self.me.clock.posted(mine, comm)
            pending = theirs.get(dest, ())
            other = next((o for o in pending if matches(mine, o)), None)
            if self.schedule is not None:    # a wildcard receive waits for the schedule's choice of its send
                other = self.schedule.posted(comm.group, mine, other)
            if other is None:
                queue.setdefault(dest, []).append(mine)
                if mine.call == "send":      # a message waits: a Probe of its destination may see it now
                    self.world.notify([self.world.ranks[comm.group.members[dest]]])
            else:
                pending.remove(other)
                send, recv = (mine, other) if mine.call == "send" else (other, mine)
                pair(self.world, comm.group, send, recv)
        self.world.switch(self.me)

    def _disjoint(self, request):
        """Raise a BufferReused if ``request``'s memory meets that of a request of this rank still pending
        (:func:`refconv.simulated.request.overlap`); nothing to compare when none is."""
        if self.pending:
            error = overlap(request, self.pending, call_site)
            if error is not None:
                raise error

    def probe(self, comm, source, tag, blocking):
        """Probe (``blocking``) or Iprobe: ``(source, tag, bytes)`` of the oldest message to this rank that a
        receive from ``source`` with ``tag`` would take, without receiving it; None when Iprobe finds none.
        Deterministic: a wildcard Probe sees the message that arrived first (not a choice of schedules='all':
        the receive that follows it is)."""
        want = Post(comm.rank, "recv", (), None, dict(peer=source, tag=tag))
        sends = comm.group.sends

        def found():
            return next((s for s in sends.get(comm.rank, ()) if _matches_send(s, want)), None)
        peer = "any rank" if source == MPI.ANY_SOURCE else f"rank {source}"
        what = f"{'Probe' if blocking else 'Iprobe'} for a message from {peer} " \
               f"{'any tag' if tag == MPI.ANY_TAG else f'tag {tag}'} on communicator {comm.group.name!r}"
        if blocking:
            self.world.block(self.me, lambda: found() is not None, lambda: what)
        with self.world.lock:
            self.world.check(self.me, what)
            send = found()
        if send is None and self.schedule is not None:
            self.schedule.polled(self.world)
        self.world.switch(self.me)
        if send is None:
            return None
        data = send.args.get("region")
        return send.rank, send.args["tag"], data.nbytes if data is not None else send.args["array"].nbytes

    # -- completing ----------------------------------------------------------------------------------------
    def wait(self, requests):
        self._check_owner(requests, "Wait")
        self.world.block(self.me, lambda: all(r.done for r in requests), lambda: _pending(requests))
        self._complete(requests)
        self.world.switch(self.me)

    def wait_any(self, requests):
        """Waitany: the first of the requests not yet completed to be done, completed; None if every one was."""
        active = [r for r in requests if not r.completed]
        if not active:
            return None
        self._check_owner(active, "Waitany")
        self.world.block(self.me, lambda: any(r.done for r in active), lambda: _pending(active))
        first = next(r for r in active if r.done)
        self._complete([first])
        self.world.switch(self.me)
        return first

    def test_any(self, requests):
        """Testany: (a done request now completed, or None; whether none was active or one completed)."""
        active = [r for r in requests if not r.completed]
        if not active:
            return None, True
        self._check_owner(active, "Testany")
        with self.world.lock:
            self.world.check(self.me, active[0].what)
            first = next((r for r in active if r.done and (self.me.clock is None or self.me.clock.arrived([r]))), None)
        if first is not None:
            self._complete([first])
        self.world.switch(self.me)
        return first, first is not None

    def test(self, requests):
        self._check_owner(requests, "Test")
        with self.world.lock:
            self.world.check(self.me, requests[0].what)
            done = all(r.done for r in requests)
            if done and self.me.clock is not None:
                done = self.me.clock.arrived(requests)
        if done:
            self._complete(requests)
        elif self.schedule is not None:   # a rank that polls while every other waits: a fence, as a wait is
            self.schedule.polled(self.world)
        self.world.switch(self.me)
        return done

    def _complete(self, requests):
        """The requests' Wait (or Test) returns: their buffers must be as posted (or as delivered); a request
        completed before is not checked again (its buffers are the rank's once more)."""
        fresh = [r for r in requests if not r.completed]
        for r in fresh:
            error = r.error or r.verify("before its request completed")
            if error is not None:
                raise error
        for r in fresh:
            r.complete()
            self.pending.pop(r, None)
        if self.me.clock is not None:
            self.me.clock.waited(requests)

    def _check_owner(self, requests, call):
        for r in requests:
            if r.owner is not self.me:
                raise InvalidParameter(f"{call} on rank {self.me.rank}: completes a request of rank {r.owner.rank} "
                                       f"({r.what}); a request belongs to the rank that started it")

    def unfinished(self):
        """A PendingRequests naming each request this rank never completed, or None."""
        if not self.pending:
            return None
        lines = [f"  {r.what}: started by {r.call} at {r.site or 'an unknown line'}"
                 + ("" if r.done else " (its data never moved)") for r in self.pending]
        return PendingRequests(f"rank {self.me.rank}: its function returned with {len(lines)} request"
                               f"{'s' if len(lines) > 1 else ''} never completed (no Wait, Test or Waitall returned "
                               f"them); MPI requires each to complete before its buffers are reused or the rank "
                               f"finalizes:\n" + "\n".join(lines))


def _claim(request, args, r):
    """What a collective's post reads and writes (comm rank ``r``): its send buffer is read, its receive
    buffer (``recv``, a Reduce's ``out``, in place too) written, a broadcast's buffer written but at its root."""
    send, recv = args.get("send"), args.get("recv")
    if send is not None and send is not recv:
        request.claim(send, False)
    for role in ("recv", "out"):
        if args.get(role) is not None:
            request.claim(args[role], True)
    if args.get("buf") is not None and recv is None:
        request.claim(args["buf"], r != args.get("root"))


def pair(world, group, send, recv):
    """Move the matched ``send``'s message into ``recv`` and complete both (under the world's lock)."""
    send.request.moving()
    recv.request.moving()
    _deliver(send, recv, group)
    if send.request.owner.clock is not None:
        send.request.owner.clock.message_done(group, send, recv)
    send.request.delivered()
    recv.request.delivered()
    world.notify([send.request.owner, recv.request.owner])


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


def _deliver(send, recv, group=None):
    """Move a matched message: the type signatures must agree and the message fit its receive (MPI's
    type matching and MPI_ERR_TRUNCATE); a shorter message fills the start of the receive."""
    into = recv.args.get("region") or buffers.Region(recv.args["array"], 0, recv.args["array"].nbytes, MPI.BYTE, "")
    data = send.args.get("region") or buffers.Region(send.args["array"], 0, send.args["array"].nbytes, MPI.BYTE, "")
    recv.request.status = (send.rank, send.args["tag"], data.nbytes)
    if data.nbytes > into.nbytes:
        raise TypeMismatch(f"{recv.request.what}: the message of {_who(send, group)} ({send.request.what}, "
                           f"{data.nbytes} bytes) is larger than the receive buffer of {_who(recv, group)} "
                           f"({into.nbytes} bytes): MPI truncates it, an error (MPI_ERR_TRUNCATE)")
    if data.items and data.basic != into.basic:
        raise TypeMismatch(f"{recv.request.what}: {_who(send, group)} sends {data.items} x {buffers.basic_name(data.basic)} "
                           f"({send.request.what}) but {_who(recv, group)} receives {buffers.basic_name(into.basic)}: the "
                           f"type signatures of a send and its receive must match")
    _shapes(recv.request.what, data.array, into.array)
    into.write(data.read(), partial=True)


def _who(post, group):
    """``rank 2`` (a world rank), with its rank in ``group`` where that differs."""
    if group is None:
        return f"rank {post.rank}"
    world = group.members[post.rank]
    return f"rank {world}" + ("" if world == post.rank else f" (rank {post.rank} of {group.name!r})")


def _check_types(group, op, posts):
    """The type signatures of a collective's blocks: what rank q sends rank r must be of the type r
    receives from q.  O(posts) when every block has one type, as refconv's calls have; pair by pair
    only when they have several."""
    if op in ("Allreduce", "Reduce", "Bcast", "Ibcast", "Split", "Barrier", "Ibarrier", "bcast", "allgather"):
        return                       # the posts' agreement compares their signatures
    kinds = frozenset().union(*(p.args.get("kinds", ()) for p in posts))    # each post's, found as it posted
    if len(kinds) <= 1:
        return
    sends, recvs = _block_lists(op, posts)
    for q, blocks in enumerate(sends):
        for r, region in enumerate(blocks):
            into = recvs[r][q]
            if region is not None and into is not None and region.nbytes and region.basic != into.basic:
                raise TypeMismatch(f"{op} (collective) on communicator {group.name!r}: {_who(posts[q], group)} sends "
                                   f"{buffers.signature(region)} to {_who(posts[r], group)}, which receives "
                                   f"{buffers.signature(into)} from it: the type signatures must match")


def _block_lists(op, posts):
    """``sends[q][r]``, ``recvs[r][q]``: the regions of the block rank q sends rank r (None where not sent)."""
    size = len(posts)
    if op in ("Scatterv", "Scatter"):
        root = posts[posts[0].args["root"]].args["send_blocks"]
        return [root if p.args["send_blocks"] is not None else [None] * size for p in posts], \
            [[p.args["recv_region"] if q == p.args["root"] else None for q in range(size)] for p in posts]
    if op in ("Gatherv", "Gather"):
        root = posts[0].args["root"]
        return [[p.args["send_region"] if r == root else None for r in range(size)] for p in posts], \
            [p.args["recv_blocks"] if p.args["recv_blocks"] is not None else [None] * size for p in posts]
    return [p.args["send_blocks"] for p in posts], [p.args["recv_blocks"] for p in posts]


def _size_mismatch(group, op, posts, error):
    """The TypeMismatch naming the two ranks whose block sizes differ (found once a write refused one)."""
    sends, recvs = _block_lists(op, posts)
    for q, blocks in enumerate(sends):
        for r, region in enumerate(blocks):
            into = recvs[r][q]
            if region is not None and into is not None and region.nbytes != into.nbytes:
                return TypeMismatch(f"{op} (collective) on communicator {group.name!r}: {_who(posts[q], group)} sends "
                                    f"{buffers.signature(region)} ({region.nbytes} bytes) to {_who(posts[r], group)}, which "
                                    f"receives {buffers.signature(into)} ({into.nbytes} bytes) from it: the counts differ")
    return TypeMismatch(f"{op} (collective) on communicator {group.name!r}: {error}")


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
    reduce = posts[0].args["reduce"]
    total = posts[0].args["send"].copy()
    for p in posts[1:]:                           # rank order: ((x_0 + x_1) + x_2) + ...
        reduce(total, p.args["send"], out=total)
    for p in posts:
        p.args["recv"][...] = total


def _reduce(group, posts, world):
    """Reduce: the reduction of every rank's send buffer, in rank order, into root's ``out``."""
    out = posts[posts[0].args["root"]].args["out"]
    if _shapes(posts[0].request.what, out, *(p.args["send"] for p in posts)):
        out.written()
        return
    reduce = posts[0].args["reduce"]
    total = posts[0].args["send"].copy()
    for p in posts[1:]:
        reduce(total, p.args["send"], out=total)
    out[...] = total


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
    root = posts[posts[0].args["root"]]
    payload = root.args["region"].read()
    for p in posts:
        if p is not root:
            p.args["region"].write(payload)


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
        "Allgather": _blocks, "Scatterv": _scatterv, "Gatherv": _gatherv, "Reduce": _reduce, "Gather": _gatherv,
        "Scatter": _scatterv, "Alltoall": _blocks, "Ibarrier": lambda group, posts, world: None, "Ibcast": _bcast}
