"""A simulated rank's MPI groups, and the communicators made from them.

========================================  ====================================================
call                                      what the simulated world does
========================================  ====================================================
``comm.Get_group()``                      the communicator's ranks, as a new group (local)
``group.Incl(ranks)``, ``Excl(ranks)``    a new group of those ranks, in that order (local)
``Group.Union``, ``Intersection``,        as MPI: the first group's order, then the second's
``Difference`` (class methods)
``Get_size``, ``Get_rank``, ``size``,     as mpi4py; ``rank`` is ``MPI.UNDEFINED`` outside it
``rank``, ``Translate_ranks``, ``Free``
``comm.Create(group)``                    collective over ``comm``: the group's ranks get a new
                                          communicator, the others ``MPI.COMM_NULL``
``comm.Create_group(group, tag=0)``       collective over the group's ranks only
========================================  ====================================================

A group is one rank's object: it is made where the call is and freed by that rank
(:mod:`refconv.simulated.leaks` reports one never freed).  Its ranks are world ranks underneath,
so groups of different communicators compare and combine as MPI's do.
"""

from mpi4py import MPI

from refconv.simulated import leaks


class SimGroup:
    """An ordered set of ranks held by one simulated rank (mpi4py's ``MPI.Group``, the part of it here)."""

    simulated = True

    def __init__(self, owner, members, call):
        self.owner, self.members, self.call = owner, tuple(members), call
        self.freed = False
        leaks.made(owner, self, "group", call)

    # -- who -------------------------------------------------------------------------------------
    def Get_size(self):
        return len(self._alive("Get_size"))

    def Get_rank(self):
        me = self.owner.rank
        return self._alive("Get_rank").index(me) if me in self.members else MPI.UNDEFINED

    size = property(Get_size)
    rank = property(Get_rank)

    def Translate_ranks(self, ranks=None, group=None):
        """The rank in ``group`` of each of this group's ``ranks`` (``MPI.UNDEFINED`` where it is absent)."""
        members = self._alive("Translate_ranks")
        ranks = range(len(members)) if ranks is None else ranks
        other = group._alive("Translate_ranks") if group is not None else None
        out = []
        for r in ranks:
            world = members[self._check_rank(r, "Translate_ranks")]
            out.append(world if other is None else (other.index(world) if world in other else MPI.UNDEFINED))
        return out

    # -- new groups ------------------------------------------------------------------------------
    def Incl(self, ranks):
        ranks = self._distinct(ranks, "Incl")
        return SimGroup(self.owner, [self.members[r] for r in ranks], "Incl")

    def Excl(self, ranks):
        out = set(self._distinct(ranks, "Excl"))
        return SimGroup(self.owner, [m for i, m in enumerate(self.members) if i not in out], "Excl")

    @classmethod
    def Union(cls, a, b):
        first = a._alive("Union")
        return SimGroup(a.owner, list(first) + [m for m in b._alive("Union") if m not in first], "Union")

    @classmethod
    def Intersection(cls, a, b):
        second = b._alive("Intersection")
        return SimGroup(a.owner, [m for m in a._alive("Intersection") if m in second], "Intersection")

    @classmethod
    def Difference(cls, a, b):
        second = b._alive("Difference")
        return SimGroup(a.owner, [m for m in a._alive("Difference") if m not in second], "Difference")

    def Free(self):
        self._alive("Free")
        self.freed = True
        leaks.freed(self.owner, self)

    # -- checks ------------------------------------------------------------------------------------
    def _alive(self, call):
        if self.freed:
            raise ValueError(f"Group.{call} on rank {self.owner.rank}: the group was freed (Free()); make a new one")
        return self.members

    def _check_rank(self, r, call):
        n = len(self._alive(call))
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < n:
            raise ValueError(f"Group.{call} on rank {self.owner.rank}: ranks must be in [0, {n}) of the group, got {r!r}")
        return r

    def _distinct(self, ranks, call):
        ranks = [self._check_rank(r, call) for r in ranks]
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"Group.{call} on rank {self.owner.rank}: ranks must be distinct, got {ranks}")
        return ranks

    def __getattr__(self, name):
        if name[:1].isupper():
            raise NotImplementedError(f"simulated ranks: Group.{name} is not implemented (refconv.simulated.groups "
                                      f"lists what is)")
        raise AttributeError(name)

    def __repr__(self):
        return f"<simulated group of {len(self.members)} ranks (world ranks {list(self.members)}) on rank {self.owner.rank}>"


def get_group(comm):
    """``comm``'s ranks as a new group of the calling rank."""
    return SimGroup(comm.owner, comm.group.members, "Get_group")


def create(comm, group):
    """``comm.Create(group)``: collective over ``comm``; every rank passes the same group."""
    members = _group_of(comm, group, "Create")
    me = comm.group.members[comm.rank]
    _register()
    new = comm._wait(comm._collective("Create", (members,), color=0 if me in members else MPI.UNDEFINED,
                                      key=members.index(me) if me in members else 0))
    return leaks.comm_made(comm.owner, new, "Create")


def create_group(comm, group, tag=0):
    """``comm.Create_group(group, tag)``: collective over the group's ranks only (each must be in it)."""
    from refconv.simulated.comm import Comm, Group

    members = _group_of(comm, group, "Create_group")
    me, world = comm.group.members[comm.rank], comm.owner.world
    if me not in members:
        raise ValueError(f"Create_group on rank {comm.rank} of {comm.group.name!r}: this rank is not in the group "
                         f"(world ranks {list(members)}); only its ranks call Create_group")
    _register()
    key = (comm.group.id, members, tag)
    with world.lock:
        counts = world.__dict__.setdefault("create_group_counts", {})
        n = counts.get((key, me), 0)
        counts[(key, me)] = n + 1
        shared = world.__dict__.setdefault("create_group_shared", {})
        new = shared.get((key, n))
        if new is None:
            new = shared[(key, n)] = Group(world, members, f"{comm.group.name}/group {tag}")
    made = Comm(new, members.index(me), comm.owner)
    made._wait(made._collective("Create_group", ()))     # blocks until every rank of the group has called
    return leaks.comm_made(comm.owner, made, "Create_group")


def _group_of(comm, group, call):
    if not isinstance(group, SimGroup):
        raise TypeError(f"{call} on rank {comm.rank} of {comm.group.name!r}: group must be a simulated group "
                        f"(comm.Get_group(), then Incl/Excl), got {type(group).__name__}")
    members = group._alive(call)
    outside = [m for m in members if m not in comm.group.members]
    if outside:
        raise ValueError(f"{call} on rank {comm.rank} of {comm.group.name!r}: the group holds world ranks {outside}, "
                         f"which are not in the communicator")
    return members


def _register():
    """Teach the engine the two collectives (here, not in engine.py: it imports comm, which imports this)."""
    from refconv.simulated import engine

    if "Create" not in engine.FIRE:
        engine.FIRE["Create"] = engine.FIRE["Split"]
        engine.FIRE["Create_group"] = lambda group, posts, world: None
