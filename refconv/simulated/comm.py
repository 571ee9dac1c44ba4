"""A simulated rank's communicator: the part of mpi4py's ``Comm`` that refconv calls, with MPI's rules.

========================================  ====================================================
call                                      what the simulated world does
========================================  ====================================================
``Get_rank``, ``Get_size``, ``rank``,     as mpi4py
``size``, ``Get_name``, ``Set_name``,
``Free``
``Split``, ``Split_type``, ``Dup``        collective; new communicators, ranked by (key, rank)
``Get_group``, ``Create``,                groups and communicators made of them
``Create_group``                          (:mod:`refconv.simulated.groups`)
``Allreduce``, ``Iallreduce``             sum (or max, min, prod) in rank order, in place too
``Ialltoallw``, ``Iallgather``            blocks of bytes (``MPI.BYTE``, ``BlockLayout``)
``Alltoallv``, ``Scatterv``, ``Gatherv``  blocks in elements of the array's dtype
``Bcast``, ``Barrier``, ``barrier``       as MPI
``Compare`` (a static method)             IDENT, CONGRUENT, SIMILAR or UNEQUAL, as MPI
``bcast``, ``allgather``                  pickled objects: each rank gets its own copy
``Isend``, ``Irecv``                      matched by communicator, source and tag, in order
``Request.Wait``, ``Test``,               completion; ``Waitall``/``Testall`` are class methods
``Waitall``, ``Testall``                  as mpi4py's
========================================  ====================================================

Any other mpi4py call raises NotImplementedError naming it.  MPI's rules are checked where
breaking them is a bug a real run could hide:

- every rank of a communicator must make the same collectives in the same order: the n-th
  collective of every rank is matched with the n-th of the others, and a different call there
  is a :class:`refconv.simulated.world.CollectiveMismatch` naming both;
- a buffer handed to a nonblocking call must stay untouched until its request completes: a send
  buffer changed before then, or a receive buffer written between the delivery and the wait, is
  a :class:`refconv.simulated.world.BufferReused`, never a silent copy of either version;
- a receive must be large enough for the message it matches; blocks must agree in size.

Reductions run in rank order (``((x_0 + x_1) + x_2) + ...``), so a run gives the same bits
every time.
"""

import pickle

import numpy
from mpi4py import MPI

from refconv.simulated import buffers, groups, leaks
from refconv.simulated.world import BufferReused, CollectiveMismatch, current_rank

_REDUCE = [(MPI.SUM, numpy.add), (MPI.PROD, numpy.multiply), (MPI.MAX, numpy.maximum), (MPI.MIN, numpy.minimum)]


def reduction(op):
    """The NumPy ufunc of an MPI reduction (mpi4py's Ops are not hashable: a list, not a dict)."""
    for mpi_op, ufunc in _REDUCE:
        if op == mpi_op:
            return ufunc
    raise NotImplementedError(f"simulated ranks: Allreduce with op {op!r} (SUM, PROD, MAX, MIN are)")


class Request:
    """One nonblocking call of one rank; done once its data has moved."""

    def __init__(self, owner, what):
        self.owner, self.what = owner, what
        self.done = False
        self.result = None         # what a blocking call returns (a new communicator, an object)
        self.payload = None        # what an object collective carries, pickled (for the reports)
        self.error = None          # a BufferReused found while the data moved, raised at completion
        self.ready = 0.0           # the logical time the call's data arrives (a priced run)
        self._watched = []         # [(array, checksum, role)]: buffers that must not change

    def watch(self, array, role):
        """Remember ``array``'s bytes now: it must not change until the request completes."""
        self._watched.append([array, buffers.fingerprint(array), role])

    def verify(self, when):
        """A BufferReused if a watched buffer changed; else None."""
        for array, crc, role in self._watched:
            if buffers.changed(array, crc):
                return BufferReused(f"rank {self.owner.rank}: the {role} buffer (shape {array.shape} {array.dtype}) of "
                                    f"{self.what} changed {when}: a real MPI could move either version; keep it "
                                    f"untouched until the request's Wait or Test returns")
        return None

    def moving(self):
        """The data is about to move: a buffer changed since the post is an error, kept for the owner."""
        self.error = self.error or self.verify("before its data moved")

    def delivered(self):
        """The data moved: receive buffers are now watched with what arrived."""
        for entry in self._watched:
            entry[1] = buffers.refreshed(*entry[:2])
        self.done = True

    # -- mpi4py's completion calls ----------------------------------------------------------------
    def Wait(self, status=None):
        self.owner.world_calls.wait([self])

    def Test(self, status=None):
        return self.owner.world_calls.test([self])

    @classmethod
    def Waitall(cls, requests, statuses=None):
        if requests:
            current_rank("Request.Waitall").world_calls.wait(list(requests))

    @classmethod
    def Testall(cls, requests, statuses=None):
        return not requests or current_rank("Request.Testall").world_calls.test(list(requests))

    def __getattr__(self, name):
        if name[:1].isupper():
            raise NotImplementedError(f"simulated ranks: Request.{name} is not implemented")
        raise AttributeError(name)

    def __repr__(self):
        return f"<simulated request: {self.what}{' (done)' if self.done else ''}>"


class Group:
    """The shared side of one communicator: its members (world ranks, in communicator order) and the
    calls they have posted.  Every field is read and written under the world's lock."""

    def __init__(self, world, members, name):
        self.world, self.members, self.name = world, tuple(members), name
        self.id = world.next_id()
        self.posted = [0] * len(members)  # collectives posted so far, per member
        self.slots = {}                   # n -> {rank: Post}: the n-th collective of each member
        self.sends, self.recvs = {}, {}   # destination rank -> point-to-point calls not yet matched, in posting order


class Post:
    """One rank's part of a collective: the call's name, what must agree across ranks, its buffers."""

    def __init__(self, rank, call, agree, request, args):
        self.rank, self.call, self.agree, self.request, self.args = rank, call, agree, request, args


class Comm:
    """One rank's communicator in a simulated world (see the module's table)."""

    simulated = True

    def __init__(self, group, rank, owner):
        self.group, self._rank, self.owner = group, rank, owner

    # -- who -------------------------------------------------------------------------------------------
    def Get_rank(self):
        return self._rank

    def Get_size(self):
        return len(self.group.members)

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_name(self):
        return self.group.name

    def Set_name(self, name):
        self.group.name = str(name)

    @leaks.frees
    def Free(self):
        pass

    @staticmethod
    def Compare(a, b):
        """``MPI.IDENT`` for the same communicator, ``MPI.CONGRUENT`` for the same ranks in the same order
        (a Split that kept them), ``MPI.SIMILAR`` for the same ranks in another order, else ``MPI.UNEQUAL``."""
        if a.group is b.group:
            return MPI.IDENT
        if a.group.members == b.group.members:
            return MPI.CONGRUENT
        return MPI.SIMILAR if sorted(a.group.members) == sorted(b.group.members) else MPI.UNEQUAL

    def barrier(self):
        self.Barrier()

    def world_rank(self, rank):
        """The world rank of this communicator's ``rank``."""
        return self.group.members[rank]

    def __repr__(self):
        return f"<simulated communicator {self.group.name!r}: rank {self._rank} of {self.Get_size()}>"

    def __getattr__(self, name):
        if name[:1].isupper() or name in ("reduce", "gather", "scatter", "send", "recv", "alltoall", "allreduce",
                                          "isend", "irecv", "sendrecv", "scan", "exscan"):
            raise NotImplementedError(f"simulated ranks: Comm.{name} is not implemented (refconv.simulated.comm "
                                      f"lists what is); run this under mpiexec")
        raise AttributeError(name)

    # -- communicators -----------------------------------------------------------------------------------
    @leaks.makes("Split")
    def Split(self, color=0, key=0):
        return self._wait(self._collective("Split", (), color=color, key=key))

    @leaks.makes("Split_type")
    def Split_type(self, split_type, key=0, info=None):
        if split_type != MPI.COMM_TYPE_SHARED:
            raise NotImplementedError(f"simulated ranks: Comm.Split_type({split_type!r}) (only COMM_TYPE_SHARED)")
        return self._wait(self._collective("Split", (), color=0, key=key))   # one node: every rank shares it

    @leaks.makes("Dup")
    def Dup(self):
        return self.Split(0, self._rank)

    def Get_group(self):
        return groups.get_group(self)        # refconv.simulated.groups: groups, Create, Create_group

    def Create(self, group):
        return groups.create(self, group)

    def Create_group(self, group, tag=0):
        return groups.create_group(self, group, tag)

    def self_comm(self):
        """A new one-rank communicator of this rank alone (not collective: no other rank takes part)."""
        world = self.owner.world
        with world.lock:
            group = Group(world, [self.group.members[self._rank]], "self")
        return Comm(group, 0, self.owner)

    # -- collectives ---------------------------------------------------------------------------------------
    def Barrier(self):
        self._wait(self._collective("Barrier", ()))

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        self.Iallreduce(sendbuf, recvbuf, op).Wait()

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        reduction(op)
        recv, _ = buffers.whole(recvbuf, "Allreduce receive")
        send = recv if sendbuf is MPI.IN_PLACE else buffers.whole(sendbuf, "Allreduce send")[0]
        if send.shape != recv.shape or send.dtype != recv.dtype:
            raise ValueError(f"Allreduce: send {send.shape} {send.dtype} and receive {recv.shape} {recv.dtype} differ")
        return self._collective("Allreduce", (send.size, send.dtype.str, op), send=send, recv=recv, op=op)

    def Bcast(self, buf, root=0):
        array, _ = buffers.whole(buf, "Bcast")
        self._wait(self._collective("Bcast", (root, array.nbytes), buf=array, root=root))

    def bcast(self, obj, root=0):
        payload = pickle.dumps(obj) if self._rank == root else None
        return self._wait(self._collective("bcast", (root,), payload=payload, root=root))

    def allgather(self, obj):
        return self._wait(self._collective("allgather", (), payload=pickle.dumps(obj)))

    def Ialltoallw(self, sendbuf, recvbuf):
        send, send_blocks = buffers.blocks(sendbuf, self.Get_size(), "Alltoallw send")
        recv, recv_blocks = buffers.blocks(recvbuf, self.Get_size(), "Alltoallw receive")
        return self._collective("Alltoallw", (), send=send, recv=recv, send_blocks=send_blocks, recv_blocks=recv_blocks)

    def Alltoallw(self, sendbuf, recvbuf):
        self.Ialltoallw(sendbuf, recvbuf).Wait()

    def Alltoallv(self, sendbuf, recvbuf):
        send, send_blocks = buffers.blocks(sendbuf, self.Get_size(), "Alltoallv send")
        recv, recv_blocks = buffers.blocks(recvbuf, self.Get_size(), "Alltoallv receive")
        self._wait(self._collective("Alltoallv", (), send=send, recv=recv, send_blocks=send_blocks,
                                    recv_blocks=recv_blocks))

    def Iallgather(self, sendbuf, recvbuf):
        send, send_region = buffers.whole(sendbuf, "Allgather send")
        if not (isinstance(recvbuf, (list, tuple)) and len(recvbuf) == 3):
            recvbuf = [buffers.as_array(recvbuf, "Allgather receive"), send_region.nbytes, MPI.BYTE]
        recv = buffers.as_array(recvbuf[0], "Allgather receive")
        count, datatype = int(recvbuf[1]), recvbuf[2]
        step = count * buffers.extent(datatype)
        recv_blocks = [buffers.Region(recv, r * step, count, datatype, f"Allgather receive block {r}")
                       for r in range(self.Get_size())]
        return self._collective("Allgather", (), send=send, recv=recv, send_blocks=[send_region] * self.Get_size(),
                                recv_blocks=recv_blocks)

    def Allgather(self, sendbuf, recvbuf):
        self.Iallgather(sendbuf, recvbuf).Wait()

    def Scatterv(self, sendbuf, recvbuf, root=0):
        recv, recv_region = buffers.whole(recvbuf, "Scatterv receive")
        send, send_blocks = (buffers.blocks(sendbuf, self.Get_size(), "Scatterv send") if self._rank == root
                             else (None, None))
        self._wait(self._collective("Scatterv", (root,), send=send, recv=recv, send_blocks=send_blocks,
                                    recv_region=recv_region, root=root))

    def Gatherv(self, sendbuf, recvbuf, root=0):
        send, send_region = buffers.whole(sendbuf, "Gatherv send")
        recv, recv_blocks = (buffers.blocks(recvbuf, self.Get_size(), "Gatherv receive") if self._rank == root
                             else (None, None))
        self._wait(self._collective("Gatherv", (root,), send=send, recv=recv, send_region=send_region,
                                    recv_blocks=recv_blocks, root=root))

    # -- point to point ------------------------------------------------------------------------------------
    def Isend(self, buf, dest, tag=0):
        array, _ = buffers.whole(buf, "Isend")
        self._check_peer(dest, "Isend", "dest")
        return self.owner.world_calls.send(self, array, dest, tag)

    def Irecv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG):
        array, _ = buffers.whole(buf, "Irecv")
        if source != MPI.ANY_SOURCE:
            self._check_peer(source, "Irecv", "source")
        return self.owner.world_calls.recv(self, array, source, tag)

    def Send(self, buf, dest, tag=0):
        self.Isend(buf, dest, tag).Wait()

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        self.Irecv(buf, source, tag).Wait()

    def _check_peer(self, peer, call, name):
        if not 0 <= peer < self.Get_size():
            raise ValueError(f"{call}: {name} must be a rank in [0, {self.Get_size()}) of {self.group.name!r}, got {peer}")

    # -- the engine's side ---------------------------------------------------------------------------------
    def _collective(self, call, agree, **args):
        return self.owner.world_calls.collective(self, call, agree, args)

    def _wait(self, request):
        request.Wait()
        return request.result


def mismatch(group, n, posts):
    """The error for collectives that differ at the n-th place of ``group``'s order."""
    calls = "; ".join(f"rank {p.rank} called {p.call}{_agree(p)}" for p in sorted(posts, key=lambda p: p.rank))
    return CollectiveMismatch(f"collective {n} on communicator {group.name!r} ({len(group.members)} ranks) differs "
                              f"between ranks: {calls}. Every rank must make the same collectives in the same "
                              f"order.{_payloads(posts)}")


def _agree(post):
    return f" {post.agree}" if post.agree else ""


def _payloads(posts):
    """What the object collectives among ``posts`` carried, cut short."""
    from_rank = [(p.rank, p.call, p.args.get("payload")) for p in sorted(posts, key=lambda p: p.rank)]
    return "".join(f"\n  rank {rank}'s {call}{carried(payload)}" for rank, call, payload in from_rank
                   if payload is not None)


def carried(payload):
    """``payload`` (a pickled object) as a short line, or nothing."""
    if payload is None:
        return ""
    try:
        text = repr(pickle.loads(payload))
    except Exception:           # an object that does not unpickle here: its size will do
        text = f"{len(payload)} bytes"
    return f"\n    carrying: {text[:2000]}"
