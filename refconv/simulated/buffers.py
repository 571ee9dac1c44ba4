"""What a simulated rank hands its communicator: buffers, their datatypes, and the regions they name.

mpi4py takes a buffer in several forms.  The simulated world reads the forms refconv's
collectives use (:mod:`refconv.collectives.ops`) and refuses any other by name:

====================================  ============================================================
form                                  meaning
====================================  ============================================================
``array``                             the whole contiguous array, in its own dtype
``[array, (counts, displs)]``         one block per rank, in elements of the array's dtype
                                      (``Alltoallv``, ``Scatterv``, ``Gatherv``)
``[array, count, datatype]``          ``count`` items of ``datatype`` from the start
                                      (``Iallgather``)
``[array, (counts, displs), types]``  one block per rank: ``counts[r]`` items of ``types[r]``
                                      from byte ``displs[r]`` (``Ialltoallw``)
====================================  ============================================================

A datatype is ``MPI.BYTE`` or a :class:`refconv.collectives.staging.BlockLayout` (``outer``
runs of ``run`` bytes, ``stride`` bytes apart, extent ``run``): the layouts refconv would
commit as MPI datatypes.  Data moves as bytes, so a sum (``Allreduce``) reads the array's dtype.

A :class:`Region` is where a message's bytes lie in one buffer: :meth:`Region.read` copies
them out, :meth:`Region.write` puts bytes in.  :func:`fingerprint` keeps a copy of a buffer's bytes, so
that a send buffer changed before its request completes is caught, not silently copied.  (A copy, not a
checksum: comparing one is exact, and four to six times faster than zlib's CRC-32 on these machines, which
took 8% of a training test on simulated ranks.)

A shapes-only array (:mod:`refconv.shapes`) is a buffer too: its regions are checked the same way and
move nothing (:class:`Payload`, a size), and its fingerprint is a watch that counts the writes that
meet it (there are no bytes to copy).  A shapes payload meeting a real buffer is an error.
"""

import numpy
from mpi4py import MPI

from mpi4py.util import dtlib

from refconv.collectives.staging import BlockLayout
from refconv.simulated import leaks, params
from refconv.simulated.world import InvalidParameter, Unsupported


def as_array(buf, what):
    """``buf`` as a C-contiguous NumPy array (MPI reads memory in place: a copy would hide writes); a
    bytearray or another writable object of the buffer protocol is viewed as one."""
    if isinstance(buf, numpy.ndarray) or getattr(buf, "shapes_only", False):
        if not buf.flags.c_contiguous:
            raise InvalidParameter(f"{what}: the buffer must be C-contiguous, got an array of shape {buf.shape} "
                                   f"with strides {buf.strides}")
        return buf
    if hasattr(buf, "__cuda_array_interface__"):
        raise Unsupported(f"{what}: simulated ranks take host arrays as buffers (refconv.collectives stages "
                          f"device arrays to the host); got a device array {type(buf).__name__}")
    if isinstance(buf, (bytearray, memoryview)):
        return as_array(numpy.asarray(memoryview(buf)), what)
    raise InvalidParameter(f"{what}: the buffer must be a NumPy array (or a bytearray), got {_form(buf)}")


def as_bytes(array):
    """The bytes of a contiguous array, as a flat uint8 view (writes go to the array)."""
    return array.reshape(-1).view(numpy.uint8)


def fingerprint(array):
    """A fingerprint of the array: a copy of its bytes, or for a shapes-only array a Watch on its elements
    (:meth:`refconv.shapes.array.ShapeArray.watch`); compare with :func:`changed`."""
    if getattr(array, "shapes_only", False):
        return array.watch()
    return array.tobytes()      # the memory's bytes: the array is C-contiguous (as_array)


def changed(array, print_):
    """Has ``array`` changed since its fingerprint ``print_`` was taken?"""
    if getattr(array, "shapes_only", False):
        return print_.count != print_.seen
    return array.tobytes() != print_


def refreshed(array, print_):
    """A new fingerprint of ``array`` (a watch's count is marked as seen instead)."""
    if getattr(array, "shapes_only", False):
        print_.seen = print_.count
        return print_
    return fingerprint(array)


class Payload:
    """The bytes a shapes-only region sends: only their number (``size``)."""
    __slots__ = ("size",)
    dtype = numpy.dtype(numpy.uint8)

    def __init__(self, size):
        self.size = size

    @property
    def shape(self):
        return (self.size,)


def _mixed(what, payload, region):
    """A message between a shapes-only buffer and a NumPy one: refuse it, naming the call."""
    from refconv.shapes.errors import Mixed
    if region.shapes:
        raise Mixed(f"{what}: a NumPy message into a shapes-only buffer", region.array, payload)
    raise Mixed(f"{what}: a shapes-only message (its {payload.size} bytes) into a NumPy buffer", payload,
                region.array)


class Layout:
    """What a Region reads of a datatype: ``outer`` runs of ``run`` bytes, ``stride`` bytes apart, one
    item ``extent`` bytes from the next; its type signature is ``run * outer / basic_size`` elements of
    ``basic`` (a NumPy dtype's ``str``, or ``"byte"`` for MPI.BYTE, MPI.PACKED and BlockLayout);
    ``name`` is what messages call it (``MPI_DOUBLE``)."""
    __slots__ = ("outer", "run", "stride", "extent", "basic", "basic_size", "name")

    def __init__(self, outer, run, stride, extent, basic, basic_size, name):
        self.outer, self.run, self.stride, self.extent = outer, run, stride, extent
        self.basic, self.basic_size, self.name = basic, basic_size, name

    @property
    def contiguous(self):
        return self.outer == 1 and self.run == self.extent


_LAYOUTS = {}   # a NumPy dtype, a BlockLayout or a predefined MPI datatype's handle -> its Layout


def dtype_layout(dtype):
    """The Layout of one element of a NumPy dtype: the MPI datatype mpi4py infers for an array of it."""
    found = _LAYOUTS.get(dtype)
    if found is None:
        mpi = MPI._typedict.get(dtype.char)
        name = mpi.Get_name() if mpi is not None else str(dtype)
        found = _LAYOUTS[dtype] = Layout(1, dtype.itemsize, dtype.itemsize, dtype.itemsize, dtype.str, dtype.itemsize,
                                         f"{name} ({dtype})")
    return found


def layout(datatype, what):
    """The Layout of ``datatype``: MPI.BYTE, any predefined MPI datatype, a contiguous or (h)vector
    derived one, or a :class:`refconv.collectives.staging.BlockLayout`."""
    if isinstance(datatype, BlockLayout):
        found = _LAYOUTS.get(datatype)
        if found is None:
            found = _LAYOUTS[datatype] = Layout(datatype.outer, datatype.run, datatype.stride, datatype.run, "byte", 1,
                                                repr(datatype))
        return found
    if not isinstance(datatype, MPI.Datatype):
        raise InvalidParameter(f"{what}: the datatype must be an MPI.Datatype, got {datatype!r:.80}")
    if datatype == MPI.DATATYPE_NULL:
        raise InvalidParameter(f"{what}: the datatype is MPI.DATATYPE_NULL")
    if datatype.is_predefined:
        found = _LAYOUTS.get(datatype.handle)
        if found is None:
            found = _LAYOUTS[datatype.handle] = _predefined(datatype)
        return found
    leaks.datatype_used(datatype)             # refconv.simulated.leaks: a derived datatype, seen at first use
    return _derived(datatype, what)


def _predefined(datatype):
    size, name = datatype.Get_size(), datatype.Get_name()
    if datatype == MPI.BYTE or datatype == MPI.PACKED:
        return Layout(1, 1, 1, 1, "byte", 1, name)
    try:
        basic = numpy.dtype(dtlib.to_numpy_dtype(datatype)).str
    except Exception:       # a type NumPy has no dtype for: its own name is its signature
        basic = name
    return Layout(1, size, size, datatype.Get_extent()[1], basic, size, name)


def _derived(datatype, what):
    """A derived datatype: contiguous, vector or hvector of a contiguous one; others are Unsupported."""
    base, combiner, params = datatype.decode()
    inner = layout(base, what)
    if not inner.contiguous or combiner not in ("CONTIGUOUS", "VECTOR", "HVECTOR", "DUP"):
        raise Unsupported(f"{what}: simulated ranks read derived datatypes made by Create_contiguous, "
                          f"Create_vector and Create_hvector of a contiguous type; got {combiner} of {inner.name}")
    if combiner == "DUP":
        return inner
    if combiner == "CONTIGUOUS":
        n = params["count"]
        return Layout(1, n * inner.run, n * inner.run, n * inner.extent, inner.basic, inner.basic_size,
                      f"contiguous({n} x {inner.name})")
    n, block = params["count"], params["blocklength"]
    stride = params["stride"] * (inner.extent if combiner == "VECTOR" else 1)
    span = (n - 1) * stride + block * inner.extent if n else 0
    return Layout(n, block * inner.run, stride, span, inner.basic, inner.basic_size,
                  f"{combiner.lower()}({n} x {block} x {inner.name}, stride {params['stride']})")


def extent(datatype):
    """Bytes from one item of ``datatype`` to the next."""
    return layout(datatype, "simulated ranks").extent


class Region:
    """``count`` items of ``datatype`` from byte ``offset`` of ``array``: a byte view of shape
    (count, outer, run) with strides (extent, stride, 1), or flat when the datatype is contiguous.
    ``basic``, ``items``: its type signature (``items`` elements of ``basic``)."""

    def __init__(self, array, offset, count, datatype, what):
        self.array, self.what = array, what
        self.shapes = getattr(array, "shapes_only", False)
        data = _Sized(array.nbytes) if self.shapes else as_bytes(array)
        kind = datatype if isinstance(datatype, Layout) else layout(datatype, what)
        if count < 0:
            raise InvalidParameter(f"{what}: the count must be >= 0, got {count}")
        self.layout, self.basic = kind, kind.basic
        self.nbytes = count * kind.outer * kind.run
        self.items = self.nbytes // kind.basic_size
        last = offset + (count - 1) * kind.extent + (kind.outer - 1) * kind.stride + kind.run if self.nbytes else offset
        if offset < 0 or last > data.size:
            raise InvalidParameter(f"{what}: the message reaches byte {last} of a buffer of {data.size} bytes "
                                   f"(shape {array.shape} {array.dtype}; {count} x {kind.name}): counts, "
                                   f"displacements or the datatype are wrong")
        if self.shapes:
            self.view = None
        elif self.nbytes == 0:
            self.view = data[:0]
        elif kind.contiguous:
            self.view = data[offset:offset + self.nbytes]
        else:
            self.view = numpy.lib.stride_tricks.as_strided(data[offset:], shape=(count, kind.outer, kind.run),
                                                           strides=(kind.extent, kind.stride, 1), writeable=True)

    def read(self):
        """A copy of the region's bytes, flat (a Payload of their number, for a shapes-only array)."""
        if self.shapes:
            return Payload(self.nbytes)
        return numpy.array(self.view, copy=True).reshape(-1)

    def write(self, payload, partial=False):
        """Put ``payload`` (flat bytes, exactly this region's size; at most that when ``partial``, a
        point-to-point message into the start of its receive) into the region."""
        if payload.size != self.nbytes and not (partial and payload.size < self.nbytes):
            raise SizeMismatch(f"{self.what}: {payload.size} bytes arrive for a receive of {self.nbytes} bytes: "
                               f"the sender's and the receiver's counts differ")
        if self.shapes != isinstance(payload, Payload):
            _mixed(self.what, payload, self)
        if self.shapes:
            self.array.written()
            return
        if payload.size == self.nbytes:
            self.view[...] = payload.reshape(self.view.shape)
        elif self.view.ndim == 1:
            self.view[:payload.size] = payload
        else:                                   # whole items, then whole runs, then the last run's start
            item = self.layout.outer * self.layout.run
            k, rest = divmod(payload.size, item)
            self.view[:k] = payload[:k * item].reshape(k, self.layout.outer, self.layout.run)
            runs, tail = divmod(rest, self.layout.run)
            start = k * item
            self.view[k, :runs] = payload[start:start + runs * self.layout.run].reshape(runs, self.layout.run)
            self.view[k, runs, :tail] = payload[start + runs * self.layout.run:]


class SizeMismatch(ValueError):
    """A block's sender and receiver disagree on its size: the engine names both ranks (TypeMismatch)."""


class _Sized:
    """What Region reads of a shapes-only array's bytes: their number."""
    __slots__ = ("size",)

    def __init__(self, size):
        self.size = size


def whole(buf, what):
    """The region of a whole buffer, in mpi4py's forms: ``array`` (all of it, in the MPI datatype of its
    dtype), ``[array, datatype]`` (as many items as fit), ``[array, count]`` (in its dtype's datatype) or
    ``[array, count, datatype]``; returns ``(array, Region)``."""
    if isinstance(buf, (list, tuple)):
        if len(buf) in (2, 3) and not (isinstance(buf[1], (int, numpy.integer)) and not isinstance(buf[1], bool)) \
                and not isinstance(buf[-1], (MPI.Datatype, BlockLayout)):
            raise InvalidParameter(f"{what}: simulated ranks read the buffer forms array, [array, datatype], "
                                   f"[array, count] and [array, count, datatype]; got {_form(buf)}")
        if len(buf) == 2 and isinstance(buf[1], (MPI.Datatype, BlockLayout)):
            array = as_array(buf[0], what)
            kind = layout(buf[1], what)
            return array, Region(array, 0, array.nbytes // kind.extent if kind.extent else 0, kind, what)
        if len(buf) in (2, 3):
            array = as_array(buf[0], what)
            if isinstance(buf[1], bool) or not isinstance(buf[1], (int, numpy.integer)):
                raise InvalidParameter(f"{what}: the count must be an int, got {buf[1]!r:.80}")
            kind = layout(buf[2], what) if len(buf) == 3 else dtype_layout(array.dtype)
            return array, Region(array, 0, int(buf[1]), kind, what)
        raise InvalidParameter(f"{what}: simulated ranks read the buffer forms array, [array, datatype], "
                               f"[array, count] and [array, count, datatype]; got {_form(buf)}")
    array = as_array(buf, what)
    return array, Region(array, 0, array.size, dtype_layout(array.dtype), what)


def blocks(buf, size, what):
    """One region per rank of a buffer given per rank: ``[array, (counts, displs)]`` (elements of the
    array's dtype) or ``[array, (counts, displs), types]`` (items of each type, byte displacements).
    Returns ``(array, Blocks)``: a list of ``size`` regions whose ``nonempty`` maps each rank with a
    non-empty block to its region.  At scale most blocks are empty (a shuffle between grids sends to a
    few ranks of K): they cost a bounds check and a small :class:`Block`, and the engine moves
    only the non-empty ones (``engine._blocks``).  A shapes-only array's blocks are Blocks too."""
    if not (isinstance(buf, (list, tuple)) and len(buf) in (2, 3) and isinstance(buf[1], (list, tuple))
            and len(buf[1]) == 2):
        raise NotImplementedError(f"{what}: simulated ranks do not read the buffer form {_form(buf)}; they read "
                                  f"[array, (counts, displs)] or [array, (counts, displs), types]")
    array = as_array(buf[0], what)
    counts, displs = (list(v) for v in buf[1])
    if len(counts) != size or len(displs) != size:
        raise ValueError(f"{what}: counts and displacements need one entry per rank ({size}), got "
                         f"{len(counts)} and {len(displs)}")
    typed = len(buf) == 3
    types = list(buf[2]) if typed else None
    item, out, buffer = 1 if typed else array.itemsize, Blocks(), _Buffer(array, what)
    shapes = getattr(array, "shapes_only", False)
    for r, (c, d) in enumerate(zip(counts, displs)):
        datatype = types[r] if typed else MPI.BYTE
        if c and not shapes:
            region = Region(array, d * item, c * item, datatype, f"{what} block {r}")
        else:
            region = _block(buffer, r, d * item, c * item, datatype)
        if region.nbytes:                     # (a count of a layout of no bytes carries none)
            out.nonempty[r] = region
        out.append(region)
    return array, out


class Blocks(list):
    """The regions of one buffer given per rank (:func:`blocks`), with ``nonempty``: ``{rank: region}``
    of the blocks that carry bytes."""

    def __init__(self):
        super().__init__()
        self.nonempty = {}


class _Buffer:
    """What the :class:`Block` s of one buffer share: the array, and how the call names it."""
    __slots__ = ("array", "what")

    def __init__(self, array, what):
        self.array, self.what = array, what


def _block(buffer, r, offset, count, datatype):
    """Rank ``r``'s :class:`Block` of ``buffer``: ``count`` items of ``datatype`` from byte ``offset``,
    checked to lie in the buffer as a Region checks it."""
    kind = layout(datatype, buffer.what)      # refuses what it does not know, as a Region does
    nbytes = count * kind.outer * kind.run
    last = offset + (count - 1) * kind.extent + (kind.outer - 1) * kind.stride + kind.run if nbytes else offset
    array = buffer.array
    if offset < 0 or last > array.nbytes:
        raise InvalidParameter(f"{buffer.what} block {r}: the message reaches byte {last} of a buffer of {array.nbytes} "
                         f"bytes (shape {array.shape} {array.dtype}): counts, displacements or the datatype are wrong")
    return Block(buffer, r, nbytes, kind.basic, nbytes // kind.basic_size)


class Block:
    """A block of a buffer given per rank with no byte view: an empty one, or one of a shapes-only
    array (whose bytes do not exist).  It reads and writes as a Region does (a message of another
    size is an error), in a few slots: at 1024 ranks an allgather over all of them makes a million
    (a Region each took some 400 bytes, 4 GiB resident in all).  It holds no reference to its
    :class:`Blocks`: no cycle, so a call's buffers are freed at once, not by the garbage collector."""
    __slots__ = ("buffer", "r", "nbytes", "basic", "items")   # basic, items: its type signature, as a Region's

    def __init__(self, buffer, r, nbytes, basic, items):
        self.buffer, self.r, self.nbytes, self.basic, self.items = buffer, r, nbytes, basic, items

    array = property(lambda self: self.buffer.array)
    what = property(lambda self: f"{self.buffer.what} block {self.r}")
    shapes = property(lambda self: getattr(self.buffer.array, "shapes_only", False))

    def read(self):
        return Payload(self.nbytes) if self.shapes else numpy.empty(0, numpy.uint8)

    def write(self, payload):
        if payload.size != self.nbytes:
            raise SizeMismatch(f"{self.what}: {payload.size} bytes arrive for a receive of {self.nbytes} bytes: "
                             f"the sender's and the receiver's counts differ")
        if self.shapes != isinstance(payload, Payload):
            _mixed(self.what, payload, self)
        if self.nbytes:
            self.buffer.array.written()


def _form(buf):
    if isinstance(buf, (list, tuple)):
        return "[" + ", ".join(type(b).__name__ for b in buf) + "]"
    return type(buf).__name__


def signature(region):
    """``4 x MPI_DOUBLE``: a region's type signature, in MPI's names (equal for equal signatures)."""
    return f"{region.items} x {basic_name(region.basic)}"


def basic_name(basic):
    """``MPI_DOUBLE (float64)`` for a basic type (a NumPy dtype's ``str``), ``MPI_BYTE`` for bytes."""
    if basic == "byte":
        return "MPI_BYTE"
    try:
        return params.type_name(numpy.dtype(basic))
    except TypeError:
        return basic


def typed(array, region, what):
    """The items of ``region`` as an array of their own dtype (the array itself when it is all of it)."""
    if getattr(array, "shapes_only", False) or (region.nbytes == array.nbytes and region.basic == array.dtype.str):
        return array
    if not region.layout.contiguous:
        raise Unsupported(f"{what}: simulated ranks reduce contiguous items only, got {region.layout.name}")
    dtype = numpy.dtype("u1" if region.basic == "byte" else region.basic)
    return region.view.view(dtype)

def kinds(*regions):
    """The basic types of the regions that carry data: what a collective's type check compares first."""
    return frozenset(r.basic for r in regions if r.nbytes)
