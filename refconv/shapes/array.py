"""``ShapeArray``: an array with a shape and a dtype, and no values and no memory.

A *root* owns bytes (counted by the rank's memory tracker, :mod:`refconv.shapes.memory`); a *view*
(basic indexing, a contiguous reshape, a transpose) holds its root, its strides and offset in the
root's elements.  Operators are direct methods (fast path); NumPy functions and ufuncs reach the class
through ``__array_function__`` and ``__array_ufunc__``.  Anything that needs a value raises
:class:`~refconv.shapes.errors.NoValues`; a NumPy array with values in the same operation raises
:class:`~refconv.shapes.errors.Mixed`.  Every write bumps the root's ``version`` and the watches of
collectives that overlap it (:func:`refconv.simulated.buffers.fingerprint`).
"""

import functools
import math
import operator
import weakref

import numpy

from refconv.shapes import memory
from refconv.shapes.errors import Mixed, NotSupported, NoValues


@functools.lru_cache(maxsize=4096)
def broadcast(*shapes):
    """The broadcast of shapes (NumPy's rule), cached: a few shapes recur all step long."""
    return numpy.broadcast_shapes(*shapes)


@functools.lru_cache(maxsize=4096)
def _resolve(ufunc, dtypes):
    """The output dtypes of ``ufunc`` on ``dtypes`` (NumPy types, or Python ``int``/``float`` as weak scalars)."""
    return ufunc.resolve_dtypes(dtypes + (None,) * ufunc.nout)[ufunc.nin:]


def _c_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _operand(x, operation, array):
    """``(shape, dtype-or-weak-type)`` of one operand; a NumPy array of more than one element is Mixed."""
    if isinstance(x, ShapeArray):
        return x.shape, x.dtype
    if isinstance(x, (numpy.ndarray, numpy.generic)):     # before float: numpy.float64 is a float
        if x.size > 1:
            raise Mixed(operation, array, x)
        return x.shape, x.dtype
    if isinstance(x, bool):
        return (), bool
    if isinstance(x, int):
        return (), int
    if isinstance(x, float):
        return (), float
    raise NotSupported(f"{operation} on {type(x).__name__}", ("ShapeArray", "Python and NumPy scalars"))


class Flags:
    __slots__ = ("c_contiguous",)

    def __init__(self, c_contiguous):
        self.c_contiguous = c_contiguous

    def __getitem__(self, name):
        return getattr(self, {"C_CONTIGUOUS": "c_contiguous", "C": "c_contiguous"}[name])


class Watch:
    """A collective's hold on ``[lo, hi)`` elements of a root: ``count`` of the writes that met it."""
    __slots__ = ("lo", "hi", "count", "seen", "__weakref__")

    def __init__(self, lo, hi):
        self.lo, self.hi, self.count, self.seen = lo, hi, 0, 0


class ShapeArray:
    """An array of ``shape`` and ``dtype`` with no values (see the module docstring)."""

    __slots__ = ("shape", "dtype", "strides_", "offset", "_root", "nbytes_owned", "tracker", "kind", "owner",
                 "version", "watches")
    shapes_only = True
    __array_priority__ = 100

    def __init__(self, shape, dtype, root=None, strides=None, offset=0):
        self.tracker = None
        self.shape = (operator.index(shape),) if isinstance(shape, (int, numpy.integer)) else \
            tuple(operator.index(n) for n in shape)
        self.dtype = numpy.dtype(dtype)
        if root is None:
            self._root, self.strides_, self.offset = None, _c_strides(self.shape), 0   # no cycle: freed at once
            self.version, self.watches, self.owner = 0, None, None
            self.nbytes_owned = math.prod(self.shape) * self.dtype.itemsize
            self.tracker = tracker = memory.current()
            if tracker is not None:
                tracker.alloc(self)
        else:
            self._root, self.strides_, self.offset = root, strides, offset

    def __del__(self):
        tracker = self.tracker
        if tracker is not None and self._root is None:
            tracker.free(self)

    # -- attributes
    root = property(lambda self: self if self._root is None else self._root, doc="The array that owns the bytes (itself for a root).")
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: math.prod(self.shape) * self.dtype.itemsize)
    T = property(lambda self: self.transpose())
    base = property(lambda self: None if self.root is self else self.root)

    @property
    def strides(self):
        return tuple(s * self.dtype.itemsize for s in self.strides_)

    @property
    def flags(self):
        return Flags(self._contiguous())

    def _contiguous(self):
        if self.root is self:
            return True
        expected = 1
        for n, s in zip(reversed(self.shape), reversed(self.strides_)):
            if n == 0:
                return True
            if n != 1:
                if s != expected:
                    return False
                expected *= n
        return True

    def interval(self):
        """``[lo, hi)``: the root's elements this array spans."""
        if self.root is self:
            return 0, self.size
        if 0 in self.shape:
            return self.offset, self.offset
        lo = hi = self.offset
        for n, s in zip(self.shape, self.strides_):
            if s >= 0:
                hi += (n - 1) * s
            else:
                lo += (n - 1) * s
        return lo, hi + 1

    def __array_namespace__(self, api_version=None):
        from refconv.shapes.namespace import xp
        return xp

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __repr__(self):
        return f"ShapeArray({self.shape}, {self.dtype})"

    __str__ = __repr__

    def __format__(self, spec):
        if spec:
            raise NoValues(f"format(..., {spec!r})", self)
        return repr(self)

    # -- what needs a value
    def _no(name):
        def method(self, *args, **kwargs):
            raise NoValues(name, self)
        method.__name__ = name
        return method

    __float__, __int__, __index__, __bool__, __complex__ = (
        _no("float()"), _no("int()"), _no("operator.index()"), _no("bool()"), _no("complex()"))
    item, tolist, tobytes = _no("item()"), _no("tolist()"), _no("tobytes()")

    def __array__(self, dtype=None, copy=None):
        raise NoValues("numpy.asarray() (or another conversion to a NumPy array)", self)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    # -- writes
    def written(self, lo=None, hi=None):
        """Record a write of this array's elements (all of them by default): the root's version and watches."""
        root = self.root
        root.version += 1
        if root.watches:
            if lo is None:
                lo, hi = self.interval()
            for w in list(root.watches):
                if lo < w.hi and w.lo < hi:
                    w.count += 1

    def watch(self):
        """A :class:`Watch` on this (contiguous) array's elements of its root."""
        w = Watch(*self.interval())
        root = self.root
        if root.watches is None:
            root.watches = weakref.WeakSet()
        root.watches.add(w)
        return w

    def _take(self, value, operation):
        """Check that ``value`` can be written into this array (broadcast, no values mixed in)."""
        shape, _ = _operand(value, operation, self)
        if shape != self.shape and broadcast(shape, self.shape) != self.shape:
            raise ValueError(f"{operation}: could not broadcast shape {shape} into shape {self.shape}")

    # -- views and copies
    def _view(self, shape, strides, offset):
        return ShapeArray(shape, self.dtype, self.root, tuple(strides), offset)

    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        shape = tuple(operator.index(n) for n in shape)
        if -1 in shape:
            known = math.prod(n for n in shape if n != -1)
            shape = tuple(self.size // known if n == -1 else n for n in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape array of size {self.size} into shape {shape}")
        source = self if self._contiguous() else self.copy()
        return source._view(shape, _c_strides(shape), source.offset)

    def ravel(self, order="C"):
        return self.reshape(-1)

    def flatten(self, order="C"):
        return self.copy().reshape(-1)

    def view(self, dtype=None):
        if dtype is None or numpy.dtype(dtype) == self.dtype:
            return self._view(self.shape, self.strides_, self.offset)
        raise NotSupported(f"view({dtype})", ("view() of the same dtype",))

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = axes[0]
        axes = tuple(axes) or tuple(reversed(range(self.ndim)))
        return self._view(tuple(self.shape[a] for a in axes), [self.strides_[a] for a in axes], self.offset)

    def copy(self, order="C"):
        return ShapeArray(self.shape, self.dtype)

    def astype(self, dtype, copy=True, order="K", casting="unsafe"):
        dtype = numpy.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        return ShapeArray(self.shape, dtype)

    def fill(self, value):
        self.written()

    def _reduced(self, axis, keepdims, dtype):
        axes = range(self.ndim) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
        axes = {a % self.ndim for a in axes}
        shape = tuple(1 if i in axes else n for i, n in enumerate(self.shape) if keepdims or i not in axes)
        return ShapeArray(shape, dtype)

    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return self._reduce(numpy.add, axis, dtype, out, keepdims)

    def max(self, axis=None, out=None, keepdims=False):
        return self._reduce(numpy.maximum, axis, None, out, keepdims)

    def min(self, axis=None, out=None, keepdims=False):
        return self._reduce(numpy.minimum, axis, None, out, keepdims)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        dtype = dtype or (self.dtype if self.dtype.kind in "fc" else numpy.float64)
        return self._reduce(numpy.add, axis, dtype, out, keepdims)

    def all(self, axis=None, out=None, keepdims=False):
        return self._reduce(numpy.logical_and, axis, bool, out, keepdims)

    def any(self, axis=None, out=None, keepdims=False):
        return self._reduce(numpy.logical_or, axis, bool, out, keepdims)

    def argmax(self, axis=None, out=None, keepdims=False):
        return self._reduce(numpy.maximum, axis, numpy.intp, out, keepdims)

    def _reduce(self, ufunc, axis, dtype, out, keepdims):
        if dtype is None:
            dtype = self.dtype
            if ufunc is numpy.add and self.dtype.kind in "bi" and self.dtype.itemsize < 8:
                dtype = numpy.int64 if self.dtype.kind != "u" else numpy.uint64
        result = self._reduced(axis, keepdims, dtype)
        if out is not None:
            out = out[0] if isinstance(out, tuple) else out
            out._take(result, f"{ufunc.__name__}.reduce")
            out.written()
            return out
        return result

    # -- indexing
    def _index(self, index):
        """``(shape, strides, offset, advanced)`` of ``self[index]``; advanced: True when a copy."""
        if not isinstance(index, tuple):
            index = (index,)
        n_explicit = sum(1 for i in index if i is not None and i is not Ellipsis)
        if any(i is Ellipsis for i in index):
            at = next(k for k, i in enumerate(index) if i is Ellipsis)
            index = index[:at] + (slice(None),) * (self.ndim - n_explicit) + index[at + 1:]
        elif n_explicit < self.ndim:
            index = index + (slice(None),) * (self.ndim - n_explicit)
        if n_explicit > self.ndim:
            raise IndexError(f"too many indices for array: array is {self.ndim}-dimensional, but {n_explicit} "
                             f"were indexed")
        shape, strides, offset, dim = [], [], self.offset, 0
        advanced, where = [], []
        for i in index:
            if i is None:
                shape.append(1)
                strides.append(0)
                continue
            n, s = self.shape[dim], self.strides_[dim]
            if isinstance(i, slice):
                start, stop, step = i.indices(n)
                shape.append(len(range(start, stop, step)))
                strides.append(s * step)
                offset += start * s
            elif isinstance(i, (int, numpy.integer)):
                k = int(i)
                if not -n <= k < n:
                    raise IndexError(f"index {k} is out of bounds for axis {dim} with size {n}")
                offset += (k % n) * s
            else:
                advanced.append(self._index_shape(i))
                where.append(len(shape))
                shape.append(None)
                strides.append(None)
            dim += 1
        if not advanced:
            return tuple(shape), strides, offset, False
        joint = broadcast(*advanced)
        rest = [n for n in shape if n is not None]
        adjacent = where == list(range(where[0], where[0] + len(where)))
        at = where[0] if adjacent else 0
        return tuple(rest[:at]) + joint + tuple(rest[at:]), None, None, True

    def _index_shape(self, i):
        if isinstance(i, ShapeArray):
            if i.dtype == bool:
                raise NoValues("boolean indexing", i)
            return i.shape
        i = numpy.asarray(i)
        if i.dtype == bool:
            return (int(numpy.count_nonzero(i)),) + i.shape[1:]
        if i.dtype.kind not in "iu":
            raise IndexError(f"arrays used as indices must be of integer (or boolean) type, got {i.dtype}")
        return i.shape

    def __getitem__(self, index):
        shape, strides, offset, advanced = self._index(index)
        if advanced:
            return ShapeArray(shape, self.dtype)
        return self._view(shape, strides, offset)

    def __setitem__(self, index, value):
        shape, strides, offset, advanced = self._index(index)
        target = ShapeArray.__new__(ShapeArray)
        target.shape, target.dtype, target._root = shape, self.dtype, self.root
        if advanced:
            target.strides_, target.offset = self.strides_, self.offset   # the whole array may be written
            lo, hi = self.interval()
        else:
            target.strides_, target.offset = tuple(strides), offset
            lo, hi = target.interval()
        target.tracker = None
        target._take(value, "__setitem__")
        self.written(lo, hi)

    # -- arithmetic: direct methods (numpy's dispatch costs ~10 µs a call)
    def _binary(self, other, ufunc, reflected=False):
        shape, dtype = _operand(other, f"numpy.{ufunc.__name__}", self)
        out_shape = self.shape if shape == self.shape else broadcast(self.shape, shape)
        dtypes = (dtype, self.dtype) if reflected else (self.dtype, dtype)
        return ShapeArray(out_shape, _resolve(ufunc, tuple(_dt(d) for d in dtypes))[0])

    def _inplace(self, other, ufunc):
        result = self._binary(other, ufunc)
        if result.shape != self.shape:
            raise ValueError(f"non-broadcastable output operand with shape {self.shape} doesn't match the "
                             f"broadcast shape {result.shape}")
        if not numpy.can_cast(result.dtype, self.dtype, "same_kind"):
            raise TypeError(f"numpy.{ufunc.__name__}: cannot cast the result {result.dtype} to {self.dtype} "
                            f"with casting rule 'same_kind'")
        self.written()
        return self

    def __add__(self, o): return self._binary(o, numpy.add)
    def __radd__(self, o): return self._binary(o, numpy.add, True)
    def __sub__(self, o): return self._binary(o, numpy.subtract)
    def __rsub__(self, o): return self._binary(o, numpy.subtract, True)
    def __mul__(self, o): return self._binary(o, numpy.multiply)
    def __rmul__(self, o): return self._binary(o, numpy.multiply, True)
    def __truediv__(self, o): return self._binary(o, numpy.true_divide)
    def __rtruediv__(self, o): return self._binary(o, numpy.true_divide, True)
    def __pow__(self, o): return self._binary(o, numpy.power)
    def __lt__(self, o): return self._binary(o, numpy.less)
    def __le__(self, o): return self._binary(o, numpy.less_equal)
    def __gt__(self, o): return self._binary(o, numpy.greater)
    def __ge__(self, o): return self._binary(o, numpy.greater_equal)
    def __eq__(self, o): return self._binary(o, numpy.equal)
    def __ne__(self, o): return self._binary(o, numpy.not_equal)
    def __and__(self, o): return self._binary(o, numpy.logical_and)
    def __or__(self, o): return self._binary(o, numpy.logical_or)
    def __iadd__(self, o): return self._inplace(o, numpy.add)
    def __isub__(self, o): return self._inplace(o, numpy.subtract)
    def __imul__(self, o): return self._inplace(o, numpy.multiply)
    def __itruediv__(self, o): return self._inplace(o, numpy.true_divide)
    __hash__ = None

    def __neg__(self):
        return ShapeArray(self.shape, self.dtype)

    def __abs__(self):
        return ShapeArray(self.shape, self.dtype)

    def __matmul__(self, other):
        return _matmul(self, other)

    def __rmatmul__(self, other):
        return _matmul(other, self)

    # -- NumPy's protocols
    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        from refconv.shapes import dispatch
        return dispatch.ufunc(self, ufunc, method, inputs, out, kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from refconv.shapes import dispatch
        return dispatch.function(func, args, kwargs)


def _dt(d):
    return d if d in (int, float, bool) else numpy.dtype(d)


def _matmul(a, b):
    sa, da = _operand(a, "numpy.matmul", a if isinstance(a, ShapeArray) else b)
    sb, db = _operand(b, "numpy.matmul", a if isinstance(a, ShapeArray) else b)
    if not sa or not sb:
        raise ValueError("matmul: an operand is a scalar")
    left = sa if len(sa) > 1 else (1,) + sa
    right = sb if len(sb) > 1 else sb + (1,)
    if left[-1] != right[-2]:
        raise ValueError(f"matmul: input operand 1 has a mismatch in its core dimension 0 (size {right[-2]} "
                         f"is different from {left[-1]}): shapes {sa} and {sb}")
    shape = broadcast(left[:-2], right[:-2]) + (left[-2], right[-1])
    if len(sa) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(sb) == 1:
        shape = shape[:-1]
    return ShapeArray(shape, _resolve(numpy.matmul, (_dt(da), _dt(db)))[0])
