"""A simulated rank's communicator: the part of mpi4py's ``Comm`` that refconv calls, with MPI's rules.

========================================  ====================================================
call                                      what the simulated world does
========================================  ====================================================
``Get_rank``, ``Get_size``, ``rank``,     as mpi4py; ``Get_attr(MPI.TAG_UB)``: the largest tag
``size``, ``Get_name``, ``Set_name``,
``Free``, ``Get_attr``
``Split``, ``Split_type``, ``Dup``        collective; new communicators, ranked by (key, rank);
                                          ``MPI.UNDEFINED``: ``MPI.COMM_NULL``
``Get_group``, ``Create``,                groups and communicators made of them
``Create_group``                          (:mod:`refconv.simulated.groups`)
``Allreduce``, ``Iallreduce``             MPI's reductions (and user-defined ops) in rank order,
                                          in place too
``Ialltoallw``, ``Alltoallw``,            blocks of bytes (``MPI.BYTE``, ``BlockLayout``) or of
``Iallgather``, ``Allgather``             any datatype
``Alltoallv``, ``Scatterv``, ``Gatherv``  blocks in elements of the array's dtype
``Bcast``, ``Barrier``, ``barrier``       as MPI (and :mod:`refconv.simulated.rooted`'s Reduce, Gather,
                                          Scatter, Alltoall, Ibarrier, Ibcast)
``Compare`` (a static method)             IDENT, CONGRUENT, SIMILAR or UNEQUAL, as MPI
``bcast``, ``allgather``                  pickled objects: each rank gets its own copy
``Isend``, ``Issend``, ``Irecv``,         matched by communicator, source and tag, in order;
``Send``, ``Ssend``, ``Recv``,            ``MPI.PROC_NULL``, ``ANY_SOURCE``, ``ANY_TAG`` as MPI
``Sendrecv``
``Probe``, ``Iprobe``                     the status of the oldest message a receive would take,
                                          not received; a wildcard Probe is not a schedule choice
``Request.Wait``, ``Test``,               completion, the ``MPI.Status`` given filled;
``Waitall``, ``Testall``, ``Waitany``,    ``Waitall``/``Testall``/``Waitany``/``Testany`` are
``Testany``                               class methods as mpi4py's
========================================  ====================================================

Any other mpi4py call raises :class:`refconv.simulated.world.Unsupported` naming it.  MPI's rules
are checked where breaking them is a bug a real run could hide:

- every parameter as MPI checks it (:mod:`refconv.simulated.params`): a bad one is an
  ``InvalidParameter`` naming the call, the parameter, the rank and the allowed range;
- every rank of a communicator must make the same collectives in the same order: the n-th
  collective of every rank is matched with the n-th of the others, and a different call there
  is a :class:`refconv.simulated.world.CollectiveMismatch` naming both;
- a buffer handed to a nonblocking call must stay untouched until its request completes: a send
  buffer changed before then, or a receive buffer written before the wait, is a
  :class:`refconv.simulated.world.BufferReused`, never a silent copy of either version; a
  nonblocking receive's buffer holds poison until then (:mod:`refconv.simulated.poison`);
- every request must complete before the rank's function returns (``PendingRequests``);
- the type signatures of a message's two sides must match, and a message fit its receive
  (``TypeMismatch``, naming both ranks).

Reductions run in rank order (``((x_0 + x_1) + x_2) + ...``), so a run gives the same bits
every time.
"""

import pickle

import numpy
from mpi4py import MPI

from refconv.simulated import buffers, groups, leaks, params
from refconv.simulated.params import op_name
from refconv.simulated.request import PERSISTENT, Request  # noqa: F401 -- Request: simulated.comm.Request, as before
from refconv.simulated.rooted import Collectives
from refconv.simulated.world import CollectiveMismatch, FreedComm, InvalidParameter, Unsupported, call_site, persistent

PROC_NULL = (("PROC_NULL", MPI.PROC_NULL),)
SOURCES = (("ANY_SOURCE", MPI.ANY_SOURCE), ("PROC_NULL", MPI.PROC_NULL))


def reduction(op, dtype=None):
    """The reduction of an MPI op, ``f(a, b, out)`` (:func:`refconv.simulated.params.reduction`)."""
    return params.reduction(op, dtype, "simulated ranks")


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
    """One rank's part of a collective: the operation (``call``, what the engine runs), the name the rank
    called it by (``name``: Iallreduce for a nonblocking Allreduce, Dup for a Split that keeps every rank;
    MPI matches a collective only with the same call), what must agree across ranks, its buffers."""

    def __init__(self, rank, call, agree, request, args, name=None):
        self.rank, self.call, self.agree, self.request, self.args = rank, call, agree, request, args
        self.name = name or call


class Comm(Collectives):
    """One rank's communicator in a simulated world (see the module's table; :mod:`refconv.simulated.rooted`
    adds Reduce, Gather, Scatter, Alltoall, Ibarrier and Ibcast)."""

    simulated = True

    def __init__(self, group, rank, owner):
        self.group, self._rank, self.owner = group, rank, owner
        self.freed = False

    # -- who -------------------------------------------------------------------------------------------
    def Get_rank(self):
        if self.freed:
            self._live("Get_rank")
        return self._rank

    def Get_size(self):
        if self.freed:
            self._live("Get_size")
        return len(self.group.members)

    rank = property(Get_rank)
    size = property(Get_size)

    def Get_name(self):
        return self.group.name

    def Set_name(self, name):
        self.group.name = str(name)

    def Get_attr(self, keyval):
        """``MPI.TAG_UB``: the largest tag (:data:`refconv.simulated.params.TAG_UB`); other attributes are not simulated."""
        self._live("Get_attr")
        keyval = params.integer(keyval, self, "Get_attr", "keyval")
        if keyval == MPI.TAG_UB:
            return params.TAG_UB
        raise Unsupported(f"simulated ranks: Comm.Get_attr({keyval}) (only MPI.TAG_UB is simulated)")

    @leaks.frees
    def Free(self):
        self._live("Free")
        if self is self.owner.comm:
            raise InvalidParameter(f"Free on rank {self.owner.rank}: the world communicator may not be freed "
                                   f"(MPI_COMM_WORLD, MPI_ERR_COMM)")
        self.freed = True

    @staticmethod
    def Compare(a, b):
        """``MPI.IDENT`` for the same communicator, ``MPI.CONGRUENT`` for the same ranks in the same order
        (a Split that kept them), ``MPI.SIMILAR`` for the same ranks in another order, else ``MPI.UNEQUAL``."""
        for name, c in (("first", a), ("second", b)):
            if not isinstance(c, Comm):
                raise InvalidParameter(f"Comm.Compare: the {name} communicator must be a simulated one, got "
                                       f"{params.show(c)}")
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
        return f"<simulated communicator {self.group.name!r}: rank {self._rank} of {len(self.group.members)}" \
               f"{' (freed)' if self.freed else ''}>"

    def __getattr__(self, name):
        if name in PERSISTENT or name[:1].isupper() and name.endswith("_init"):   # Allreduce_init too
            raise persistent(f"Comm.{name}")
        if name[:1].isupper() or name in ("reduce", "gather", "scatter", "send", "recv", "alltoall", "allreduce",
                                          "isend", "irecv", "sendrecv", "scan", "exscan"):
            raise Unsupported(f"simulated ranks: Comm.{name} is not implemented (refconv.simulated.comm "
                              f"lists what is); run this under mpiexec")
        raise AttributeError(name)

    def _live(self, call):
        """Raise FreedComm for a call on this communicator after its Free()."""
        if self.freed:
            raise FreedComm(f"{call} on rank {self.owner.rank}: communicator {self.group.name!r} was freed "
                            f"(Free()); a call on it is erroneous")

    def _what(self, call, part=""):
        """``"Isend on rank 2 of 'world'"``: how a buffer's errors name the call."""
        return f"{call}{part} on rank {self.owner.rank} of {self.group.name!r}"

    # -- communicators -----------------------------------------------------------------------------------
    @leaks.makes("Split")
    def Split(self, color=0, key=0):
        self._live("Split")
        color, key = params.colour(color, self, "Split"), params.integer(key, self, "Split", "key")
        return self._wait(self._collective("Split", (), color=color, key=key))

    @leaks.makes("Split_type")
    def Split_type(self, split_type, key=0, info=None):
        self._live("Split_type")
        key = params.integer(key, self, "Split_type", "key")
        if split_type == MPI.UNDEFINED:
            return self._wait(self._collective("Split", (), color=MPI.UNDEFINED, key=key, call="Split_type"))
        if split_type != MPI.COMM_TYPE_SHARED:
            raise Unsupported(f"simulated ranks: Comm.Split_type({params.show(split_type)}) (only COMM_TYPE_SHARED and "
                              f"UNDEFINED)")
        return self._wait(self._collective("Split", (), color=0, key=key, call="Split_type"))   # one node: every rank shares it

    @leaks.makes("Dup")
    def Dup(self):
        """A Split that keeps every rank in its place, but a collective of its own: a Dup on one rank never
        matches a Split on another (MPI)."""
        self._live("Dup")
        return self._wait(self._collective("Split", (), color=0, key=self._rank, call="Dup"))

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
        self._live("Barrier")
        self._wait(self._collective("Barrier", ()))

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        self._wait(self._allreduce("Allreduce", sendbuf, recvbuf, op, nonblocking=False))

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        return self._allreduce("Iallreduce", sendbuf, recvbuf, op, nonblocking=True)

    def _allreduce(self, call, sendbuf, recvbuf, op, nonblocking):
        self._live(call)
        recv_array, recv_region = buffers.whole(recvbuf, self._what(call, " receive"))
        recv = buffers.typed(recv_array, recv_region, self._what(call, " receive"))
        if sendbuf is MPI.IN_PLACE:
            send, send_region = recv, recv_region
        else:
            send_array, send_region = buffers.whole(sendbuf, self._what(call, " send"))
            send = buffers.typed(send_array, send_region, self._what(call, " send"))
        if send_region.items != recv_region.items or send_region.basic != recv_region.basic:
            raise InvalidParameter(f"{self._what(call)}: the send buffer ({buffers.signature(send_region)}) and the receive "
                                   f"buffer ({buffers.signature(recv_region)}) must hold as many items of one type")
        reduce = params.reduction(op, send.dtype, self._what(call))
        return self._collective("Allreduce", (buffers.signature(send_region), op_name(op)), send=send, recv=recv, op=op,
                                reduce=reduce, poison=nonblocking, call=call)

    def Bcast(self, buf, root=0):
        self._live("Bcast")
        root = params.rank(root, self, "Bcast", "root")
        array, region = buffers.whole(buf, self._what("Bcast"))
        self._wait(self._collective("Bcast", (root, buffers.signature(region)), buf=array, region=region, root=root))

    def bcast(self, obj, root=0):
        self._live("bcast")
        root = params.rank(root, self, "bcast", "root")
        payload = _pickled(obj, self._what("bcast")) if self._rank == root else None
        return self._wait(self._collective("bcast", (root,), payload=payload, root=root))

    def allgather(self, obj):
        self._live("allgather")
        return self._wait(self._collective("allgather", (), payload=_pickled(obj, self._what("allgather"))))

    def Ialltoallw(self, sendbuf, recvbuf):
        return self._alltoallw("Ialltoallw", sendbuf, recvbuf, nonblocking=True)

    def Alltoallw(self, sendbuf, recvbuf):
        self._wait(self._alltoallw("Alltoallw", sendbuf, recvbuf, nonblocking=False))

    def _alltoallw(self, call, sendbuf, recvbuf, nonblocking):
        self._live(call)
        send, send_blocks = _blocks(self, sendbuf, self._what(call, " send"), typed=True)
        recv, recv_blocks = _blocks(self, recvbuf, self._what(call, " receive"), typed=True)
        return self._collective("Alltoallw", (), send=send, recv=recv, send_blocks=send_blocks, recv_blocks=recv_blocks,
                                kinds=buffers.kinds(*send_blocks, *recv_blocks), poison=nonblocking, call=call)

    def Alltoallv(self, sendbuf, recvbuf):
        self._live("Alltoallv")
        send, send_blocks = _blocks(self, sendbuf, self._what("Alltoallv", " send"))
        recv, recv_blocks = _blocks(self, recvbuf, self._what("Alltoallv", " receive"))
        self._wait(self._collective("Alltoallv", (), send=send, recv=recv, send_blocks=send_blocks,
                                    recv_blocks=recv_blocks, kinds=buffers.kinds(*send_blocks, *recv_blocks)))

    def Iallgather(self, sendbuf, recvbuf):
        return self._allgather("Iallgather", sendbuf, recvbuf, nonblocking=True)

    def Allgather(self, sendbuf, recvbuf):
        self._wait(self._allgather("Allgather", sendbuf, recvbuf, nonblocking=False))

    def _allgather(self, call, sendbuf, recvbuf, nonblocking):
        self._live(call)
        what = self._what(call, " receive")
        send, send_region = buffers.whole(sendbuf, self._what(call, " send"))
        if isinstance(recvbuf, (list, tuple)) and len(recvbuf) == 3:
            recv = buffers.as_array(recvbuf[0], what)
            count = params.count(recvbuf[1], self, call, "the receive count")
            kind = buffers.layout(recvbuf[2], what)
        else:       # every rank's block as the send buffer's type signature
            recv = buffers.as_array(recvbuf[0] if isinstance(recvbuf, (list, tuple)) else recvbuf, what)
            kind = send_region.layout
            count = send_region.nbytes // (kind.outer * kind.run) if kind.run else 0
        step = count * kind.extent
        recv_blocks = [buffers.Region(recv, r * step, count, kind, f"{what} block {r}") for r in range(self.Get_size())]
        return self._collective("Allgather", (), send=send, recv=recv, send_blocks=[send_region] * self.Get_size(),
                                recv_blocks=recv_blocks, kinds=buffers.kinds(send_region, recv_blocks[0]), poison=nonblocking,
                                call=call)

    def Scatterv(self, sendbuf, recvbuf, root=0):
        self._live("Scatterv")
        root = params.rank(root, self, "Scatterv", "root")
        recv, recv_region = buffers.whole(recvbuf, self._what("Scatterv", " receive"))
        send, send_blocks = (_blocks(self, sendbuf, self._what("Scatterv", " send")) if self._rank == root
                             else (None, None))
        self._wait(self._collective("Scatterv", (root,), send=send, recv=recv, send_blocks=send_blocks,
                                    recv_region=recv_region, root=root, kinds=buffers.kinds(recv_region, *(send_blocks or ()))))

    def Gatherv(self, sendbuf, recvbuf, root=0):
        self._live("Gatherv")
        root = params.rank(root, self, "Gatherv", "root")
        send, send_region = buffers.whole(sendbuf, self._what("Gatherv", " send"))
        recv, recv_blocks = (_blocks(self, recvbuf, self._what("Gatherv", " receive")) if self._rank == root
                             else (None, None))
        self._wait(self._collective("Gatherv", (root,), send=send, recv=recv, send_region=send_region,
                                    recv_blocks=recv_blocks, root=root, kinds=buffers.kinds(send_region, *(recv_blocks or ()))))

    # -- point to point ------------------------------------------------------------------------------------
    def Isend(self, buf, dest, tag=0):
        return self._send("Isend", buf, dest, tag, call_site())

    def Issend(self, buf, dest, tag=0):
        return self._send("Issend", buf, dest, tag, call_site())   # every simulated send is synchronous

    def Send(self, buf, dest, tag=0):
        self._send("Send", buf, dest, tag, None).Wait()

    Ssend = Send

    def Irecv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG):
        return self._recv("Irecv", buf, source, tag, call_site(), poisoned=True)

    def Recv(self, buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        self._recv("Recv", buf, source, tag, None, poisoned=False).Wait(status)

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE, recvtag=MPI.ANY_TAG,
                 status=None):
        received = self._recv("Sendrecv", recvbuf, source, recvtag, None, poisoned=False)
        sent = self._send("Sendrecv", sendbuf, dest, sendtag, None)
        self.owner.world_calls.wait([received, sent])
        received.fill(status)

    def _send(self, call, buf, dest, tag, site):
        self._live(call)
        dest = params.rank(dest, self, call, "dest", special=PROC_NULL)
        tag = params.tag(tag, self, call, wildcard=False)
        array, region = buffers.whole(buf, self._what(call, " send"))
        if dest == MPI.PROC_NULL:
            return self.owner.world_calls.null(self, f"{call} to MPI.PROC_NULL", call, site)
        return self.owner.world_calls.send(self, array, dest, tag, region=region, call=call, site=site)

    def _recv(self, call, buf, source, tag, site, poisoned):
        self._live(call)
        source = params.rank(source, self, call, "source", special=SOURCES)
        tag = params.tag(tag, self, call, wildcard=True)
        array, region = buffers.whole(buf, self._what(call, " receive"))
        if not getattr(array, "shapes_only", False) and not array.flags.writeable:
            raise InvalidParameter(f"{self._what(call)}: the receive buffer is read-only")
        if source == MPI.PROC_NULL:
            return self.owner.world_calls.null(self, f"{call} from MPI.PROC_NULL", call, site)
        return self.owner.world_calls.recv(self, array, source, tag, region=region, call=call, site=site,
                                           poisoned=poisoned)

    def Probe(self, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        """Wait for a message that a receive from ``source`` with ``tag`` would take, and fill ``status``
        (its source, tag and count) without receiving it; returns True, as mpi4py."""
        self._probe("Probe", source, tag, status, blocking=True)
        return True

    def Iprobe(self, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=None):
        """Probe without waiting: whether such a message has arrived (``status`` filled when it has)."""
        return self._probe("Iprobe", source, tag, status, blocking=False)

    def _probe(self, call, source, tag, status, blocking):
        self._live(call)
        source = params.rank(source, self, call, "source", special=SOURCES)
        tag = params.tag(tag, self, call, wildcard=True)
        found = (MPI.PROC_NULL, MPI.ANY_TAG, 0) if source == MPI.PROC_NULL else \
            self.owner.world_calls.probe(self, source, tag, blocking)
        if found is None:
            return False
        answer = Request(self.owner, f"{call} on communicator {self.group.name!r}", call)
        answer.status = found
        answer.fill(status)                 # the one place a Status is filled
        return True

    # -- the engine's side ---------------------------------------------------------------------------------
    def _collective(self, op, agree, /, **args):
        return self.owner.world_calls.collective(self, op, agree, args)

    def _wait(self, request):
        request.Wait()
        return request.result


def _pickled(obj, what):
    """``obj`` pickled, as mpi4py sends an object; one that cannot be is an InvalidParameter naming the call."""
    try:
        return pickle.dumps(obj)
    except Exception as error:
        raise InvalidParameter(f"{what}: the object cannot be pickled, as mpi4py sends it: "
                               f"{type(error).__name__}: {error}") from error


def _blocks(comm, buf, what, typed=False):
    """:func:`refconv.simulated.buffers.blocks` of a per-rank buffer, its counts, displacements and
    datatypes checked first (``typed``: ``[array, (counts, displs), types]``, as Alltoallw's)."""
    size = comm.Get_size()
    form = "[array, (counts, displs), types]" if typed else "[array, (counts, displs)]"
    if not (isinstance(buf, (list, tuple)) and len(buf) == (3 if typed else 2) and isinstance(buf[1], (list, tuple))
            and len(buf[1]) == 2):
        raise InvalidParameter(f"{what}: the buffer must be {form}, got {buffers._form(buf)}")
    for name, values in zip(("counts", "displacements"), buf[1]):
        if not isinstance(values, (list, tuple, numpy.ndarray)) or len(values) != size:
            raise InvalidParameter(f"{what}: {name} must be a list of one int per rank ({size}), got {params.show(values)}")
        if all(type(v) is int for v in values) and (name != "counts" or min(values, default=0) >= 0):
            continue                              # the common case, in one pass
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, numpy.integer)) or (name == "counts" and v < 0):
                raise InvalidParameter(f"{what}: {name} must be ints{' >= 0' if name == 'counts' else ''}, got "
                                       f"{params.show(list(values))}")
    if typed and (not isinstance(buf[2], (list, tuple)) or len(buf[2]) != size):
        raise InvalidParameter(f"{what}: types must be a list of one datatype per rank ({size}), got {params.show(buf[2])}")
    array, regions = buffers.blocks(buf, size, what)
    if not typed:
        basic, item = array.dtype.str, array.itemsize
        for region in regions:
            region.basic = basic                 # blocks in elements of the array's dtype
            region.items = region.nbytes // item
    return array, regions



def mismatch(group, n, posts):
    """The error for collectives that differ at the n-th place of ``group``'s order."""
    calls = "; ".join(f"rank {p.rank} called {p.name}{_agree(p)}" for p in sorted(posts, key=lambda p: p.rank))
    return CollectiveMismatch(f"collective {n} on communicator {group.name!r} ({len(group.members)} ranks) differs "
                              f"between ranks: {calls}. Every rank must make the same collectives in the same "
                              f"order.{_payloads(posts)}")


def _agree(post):
    return f" {post.agree}" if post.agree else ""


def _payloads(posts):
    """What the object collectives among ``posts`` carried, cut short."""
    from_rank = [(p.rank, p.name, p.args.get("payload")) for p in sorted(posts, key=lambda p: p.rank)]
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
