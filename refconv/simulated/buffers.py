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
them out, :meth:`Region.write` puts bytes in.  :func:`fingerprint` fingerprints a buffer, so that
a send buffer changed before its request completes is caught, not silently copied.

A shapes-only array (:mod:`refconv.shapes`) is a buffer too: its regions are checked the same way and
move nothing (:class:`Payload`, a size), and its fingerprint is a watch that counts the writes that
meet it (there are no bytes to checksum).  A shapes payload meeting a real buffer is an error.
"""

import zlib

import numpy
from mpi4py import MPI

from refconv.collectives.staging import BlockLayout


def as_array(buf, what):
    """``buf`` as a C-contiguous NumPy array (MPI reads memory in place: a copy would hide writes)."""
    if isinstance(buf, numpy.ndarray) or getattr(buf, "shapes_only", False):
        if not buf.flags.c_contiguous:
            raise ValueError(f"{what}: the buffer must be C-contiguous, got an array of shape {buf.shape} "
                             f"with strides {buf.strides}")
        return buf
    raise NotImplementedError(f"{what}: simulated ranks take NumPy arrays as buffers (host-staged, as "
                              f"refconv.collectives stages them); got {type(buf).__name__}")


def as_bytes(array):
    """The bytes of a contiguous array, as a flat uint8 view (writes go to the array)."""
    return array.reshape(-1).view(numpy.uint8)


def fingerprint(array):
    """A fingerprint of the array's bytes (CRC-32), or for a shapes-only array a Watch on its elements
    (:meth:`refconv.shapes.array.ShapeArray.watch`); compare with :func:`changed`."""
    if getattr(array, "shapes_only", False):
        return array.watch()
    return zlib.crc32(memoryview(as_bytes(array)))


def changed(array, print_):
    """Has ``array`` changed since its fingerprint ``print_`` was taken?"""
    if getattr(array, "shapes_only", False):
        return print_.count != print_.seen
    return zlib.crc32(memoryview(as_bytes(array))) != print_


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


def extent(datatype):
    """Bytes from one item of ``datatype`` to the next."""
    if isinstance(datatype, BlockLayout):
        return datatype.run
    if datatype == MPI.BYTE:
        return 1
    raise NotImplementedError(f"simulated ranks: datatype {datatype!r} is not implemented (MPI.BYTE and "
                              f"refconv.collectives.staging.BlockLayout are)")


class Region:
    """``count`` items of ``datatype`` from byte ``offset`` of ``array``: a byte view of shape
    (count, outer, run) with strides (extent, stride, 1)."""

    def __init__(self, array, offset, count, datatype, what):
        self.array, self.what = array, what
        self.shapes = getattr(array, "shapes_only", False)
        data = _Sized(array.nbytes) if self.shapes else as_bytes(array)
        if isinstance(datatype, BlockLayout):
            outer, run, stride = datatype.outer, datatype.run, datatype.stride
        else:
            extent(datatype)                      # refuses what it does not know
            outer, run, stride = 1, 1, 1
        self.nbytes = count * outer * run
        last = offset + (count - 1) * extent(datatype) + (outer - 1) * stride + run if self.nbytes else offset
        if offset < 0 or last > data.size:
            raise ValueError(f"{what}: the message reaches byte {last} of a buffer of {data.size} bytes "
                             f"(shape {array.shape} {array.dtype}): counts, displacements or the datatype are wrong")
        if self.shapes:
            self.view = None
        elif self.nbytes == 0:
            self.view = data[:0]
        elif not isinstance(datatype, BlockLayout):
            self.view = data[offset:offset + count]
        else:
            self.view = numpy.lib.stride_tricks.as_strided(data[offset:], shape=(count, outer, run),
                                                           strides=(extent(datatype), stride, 1), writeable=True)

    def read(self):
        """A copy of the region's bytes, flat (a Payload of their number, for a shapes-only array)."""
        if self.shapes:
            return Payload(self.nbytes)
        return numpy.array(self.view, copy=True).reshape(-1)

    def write(self, payload):
        """Put ``payload`` (flat bytes, exactly this region's size) into the region."""
        if payload.size != self.nbytes:
            raise ValueError(f"{self.what}: {payload.size} bytes arrive for a receive of {self.nbytes} bytes: "
                             f"the sender's and the receiver's counts differ")
        if self.shapes != isinstance(payload, Payload):
            _mixed(self.what, payload, self)
        if self.shapes:
            self.array.written()
            return
        self.view[...] = payload.reshape(self.view.shape)


class _Sized:
    """What Region reads of a shapes-only array's bytes: their number."""
    __slots__ = ("size",)

    def __init__(self, size):
        self.size = size


def whole(buf, what):
    """The region of a whole buffer given as an array or ``[array, count, datatype]``; returns
    ``(array, Region)``."""
    if isinstance(buf, (list, tuple)):
        if len(buf) == 3 and isinstance(buf[1], (int, numpy.integer)):
            array = as_array(buf[0], what)
            return array, Region(array, 0, buf[1], buf[2], what)
        if len(buf) == 2 and buf[1] == MPI.BYTE:
            array = as_array(buf[0], what)
            return array, Region(array, 0, array.nbytes, MPI.BYTE, what)
        raise NotImplementedError(f"{what}: simulated ranks do not read the buffer form {_form(buf)}; "
                                  f"they read an array or [array, count, datatype]")
    array = as_array(buf, what)
    return array, Region(array, 0, array.nbytes, MPI.BYTE, what)


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
    if isinstance(datatype, BlockLayout):
        outer, run, stride = datatype.outer, datatype.run, datatype.stride
    else:
        outer, run, stride = 1, 1, 1
    step = extent(datatype)                   # refuses what it does not know, as a Region does
    nbytes = count * outer * run
    last = offset + (count - 1) * step + (outer - 1) * stride + run if nbytes else offset
    array = buffer.array
    if offset < 0 or last > array.nbytes:
        raise ValueError(f"{buffer.what} block {r}: the message reaches byte {last} of a buffer of {array.nbytes} "
                         f"bytes (shape {array.shape} {array.dtype}): counts, displacements or the datatype are wrong")
    return Block(buffer, r, nbytes)


class Block:
    """A block of a buffer given per rank with no byte view: an empty one, or one of a shapes-only
    array (whose bytes do not exist).  It reads and writes as a Region does (a message of another
    size is an error), in a few slots: at 1024 ranks an allgather over all of them makes a million
    (a Region each took some 400 bytes, 4 GiB resident in all).  It holds no reference to its
    :class:`Blocks`: no cycle, so a call's buffers are freed at once, not by the garbage collector."""
    __slots__ = ("buffer", "r", "nbytes")

    def __init__(self, buffer, r, nbytes):
        self.buffer, self.r, self.nbytes = buffer, r, nbytes

    array = property(lambda self: self.buffer.array)
    what = property(lambda self: f"{self.buffer.what} block {self.r}")
    shapes = property(lambda self: getattr(self.buffer.array, "shapes_only", False))

    def read(self):
        return Payload(self.nbytes) if self.shapes else numpy.empty(0, numpy.uint8)

    def write(self, payload):
        if payload.size != self.nbytes:
            raise ValueError(f"{self.what}: {payload.size} bytes arrive for a receive of {self.nbytes} bytes: "
                             f"the sender's and the receiver's counts differ")
        if self.shapes != isinstance(payload, Payload):
            _mixed(self.what, payload, self)
        if self.nbytes:
            self.buffer.array.written()


def _form(buf):
    if isinstance(buf, (list, tuple)):
        return "[" + ", ".join(type(b).__name__ for b in buf) + "]"
    return type(buf).__name__
