"""The parameters of a simulated rank's calls, checked as MPI checks them, and named in reports.

A bad root, rank, peer, tag, colour, op or count is an :class:`InvalidParameter` raised on the
rank that passed it, before anything is posted, with the call, the parameter, the rank and the
allowed range: ``Bcast on rank 2 of 'world': root must be in [0, 4), got 7``.  A call on a freed
communicator is a :class:`FreedComm`.  Ops and datatypes appear in every message by their MPI
names (``SUM``, ``MPI_DOUBLE``), never as ``<mpi4py.MPI.Op object at 0x...>``.

==================  ==========================================================================
parameter           allowed
==================  ==========================================================================
root                an int in ``[0, size)``
dest                an int in ``[0, size)``, or ``MPI.PROC_NULL``
source              an int in ``[0, size)``, ``MPI.ANY_SOURCE`` or ``MPI.PROC_NULL``
tag (send)          an int in ``[0, TAG_UB]`` (``comm.Get_attr(MPI.TAG_UB)``)
tag (receive)       an int in ``[0, TAG_UB]`` or ``MPI.ANY_TAG``
colour (``Split``)  an int >= 0, or ``MPI.UNDEFINED`` (that rank gets ``MPI.COMM_NULL``)
key (``Split``)     an int
op                  a predefined reduction of MPI that fits the buffer's type (``op_name``)
==================  ==========================================================================
"""

import numbers

import numpy
from mpi4py import MPI

from refconv.simulated.world import InvalidParameter, Unsupported

TAG_UB = 536870911   # MPICH's MPI_TAG_UB (MPI guarantees at least 32767): what comm.Get_attr(MPI.TAG_UB) returns

# mpi4py's Ops are not hashable: lists, not dicts.  (op, name, ufunc, the dtype kinds it takes)
_OPS = [(MPI.SUM, "SUM", numpy.add, "biufc"), (MPI.PROD, "PROD", numpy.multiply, "biufc"),
        (MPI.MAX, "MAX", numpy.maximum, "biuf"), (MPI.MIN, "MIN", numpy.minimum, "biuf"),
        (MPI.LAND, "LAND", numpy.logical_and, "biu"), (MPI.LOR, "LOR", numpy.logical_or, "biu"),
        (MPI.LXOR, "LXOR", numpy.logical_xor, "biu"), (MPI.BAND, "BAND", numpy.bitwise_and, "biu"),
        (MPI.BOR, "BOR", numpy.bitwise_or, "biu"), (MPI.BXOR, "BXOR", numpy.bitwise_xor, "biu")]
_OTHER_OPS = [(MPI.MAXLOC, "MAXLOC"), (MPI.MINLOC, "MINLOC"), (MPI.REPLACE, "REPLACE"), (MPI.NO_OP, "NO_OP"),
              (MPI.OP_NULL, "OP_NULL")]
OP_NAMES = ", ".join(name for _, name, _, _ in _OPS)


def op_name(op):
    """``SUM`` for ``MPI.SUM``; a user-defined op or anything else by its type."""
    if isinstance(op, MPI.Op):
        for mpi_op, name, _, _ in _OPS:
            if op == mpi_op:
                return name
        for mpi_op, name in _OTHER_OPS:
            if op == mpi_op:
                return name
        return "a user-defined MPI.Op"
    return f"{op!r} (a {type(op).__name__}, not an MPI.Op)"


def reduction(op, dtype, where):
    """The reduction of an MPI op over ``dtype``, as ``f(a, b, out)`` (``out = a op b``, a NumPy ufunc for
    MPI's own); an InvalidParameter or Unsupported naming ``where`` (``"Allreduce on rank 1 of 'world'"``)
    for one MPI rejects or the world lacks.  A user-defined op (``MPI.Op.Create``) runs through mpi4py's
    ``Reduce_local``, in rank order as MPI's (non-commutative ops too)."""
    if isinstance(op, MPI.Op):
        for mpi_op, name, ufunc, kinds in _OPS:
            if op == mpi_op:
                if dtype is not None and numpy.dtype(dtype).kind not in kinds:
                    raise InvalidParameter(f"{where}: op {name} is not defined on {type_name(dtype)} (MPI_ERR_OP)")
                return ufunc
        if op == MPI.MAXLOC or op == MPI.MINLOC:
            raise Unsupported(f"{where}: simulated ranks do not reduce with {op_name(op)} (pair types; "
                              f"{OP_NAMES} and user-defined ops are)")
        if not any(op == other for other, _ in _OTHER_OPS):
            return _user(op)
    raise InvalidParameter(f"{where}: op must be one of MPI's reductions ({OP_NAMES}) or a user-defined "
                           f"MPI.Op, got {op_name(op)}")


def _user(op):
    def apply(a, b, out):
        result = numpy.array(b, copy=True)
        op.Reduce_local(a, result)                # result = a op b
        out[...] = result
    return apply


def show(value):
    """``value`` as a message shows it: MPI's ops and datatypes by name (``SUM``, ``MPI_DOUBLE``), lists
    item by item, anything else by its repr, cut short."""
    if isinstance(value, MPI.Op):
        return op_name(value)
    if isinstance(value, MPI.Datatype):
        return value.Get_name() or "a derived MPI.Datatype"
    if isinstance(value, (MPI.Comm, MPI.Request, MPI.Status, MPI.Group, MPI.Info)):
        return f"an {type(value).__name__}" if type(value).__name__[0] in "AEIOU" else f"a {type(value).__name__}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(show(v) for v in value[:8]) + (", ..." if len(value) > 8 else "")
        return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def type_name(dtype):
    """``MPI_DOUBLE (float64)`` for a NumPy dtype: the MPI datatype mpi4py infers for it."""
    dtype = numpy.dtype(dtype)
    mpi = MPI._typedict.get(dtype.char)
    return f"{mpi.Get_name()} ({dtype})" if mpi is not None else str(dtype)


def where(comm, call):
    """``"Bcast on rank 2 of 'world'"``: the head of every message about ``call`` on ``comm``."""
    return f"{call} on rank {comm.owner.rank} of {comm.group.name!r}"


def integer(value, comm, call, name):
    """``value`` as an int; an InvalidParameter for a float, a string, None, a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidParameter(f"{where(comm, call)}: {name} must be an int, got {show(value)}")
    return int(value)


def rank(value, comm, call, name, *, special=()):
    """A rank of ``comm`` (``[0, size)``) or one of the ``special`` values, e.g. ``(("PROC_NULL", -1),)``."""
    value = integer(value, comm, call, name)
    size = comm.Get_size()
    if 0 <= value < size or any(value == v for _, v in special):
        return value
    extra = "".join(f" or MPI.{n} ({v})" for n, v in special)
    raise InvalidParameter(f"{where(comm, call)}: {name} must be a rank in [0, {size}) of {comm.group.name!r}{extra}, "
                           f"got {value}")


def tag(value, comm, call, *, wildcard):
    """A tag in ``[0, TAG_UB]``, or ``MPI.ANY_TAG`` where ``wildcard`` (a receive)."""
    value = integer(value, comm, call, "tag")
    if 0 <= value <= TAG_UB or (wildcard and value == MPI.ANY_TAG):
        return value
    extra = f" or MPI.ANY_TAG ({MPI.ANY_TAG})" if wildcard else ""
    raise InvalidParameter(f"{where(comm, call)}: tag must be in [0, {TAG_UB}] (MPI.TAG_UB){extra}, got {value}")


def colour(value, comm, call):
    """A Split colour: an int >= 0 or ``MPI.UNDEFINED``."""
    value = integer(value, comm, call, "color")
    if value >= 0 or value == MPI.UNDEFINED:
        return value
    raise InvalidParameter(f"{where(comm, call)}: color must be an int >= 0 or MPI.UNDEFINED ({MPI.UNDEFINED}), "
                           f"got {value}")


def count(value, comm, call, name="count"):
    """A count of items: an int >= 0."""
    value = integer(value, comm, call, name)
    if value < 0:
        raise InvalidParameter(f"{where(comm, call)}: {name} must be >= 0, got {value}")
    return value
