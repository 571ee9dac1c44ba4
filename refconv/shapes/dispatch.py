"""NumPy's functions and ufuncs on :class:`~refconv.shapes.array.ShapeArray`: shapes and dtypes out, no values."""

import math

import numpy

from refconv.shapes.array import ShapeArray, _dt, _operand, _resolve, broadcast
from refconv.shapes.errors import Mixed, NotSupported, NoValues

UFUNCS = {"add", "subtract", "multiply", "true_divide", "divide", "negative", "sqrt", "exp", "log", "maximum",
          "minimum", "power", "absolute", "square", "equal", "not_equal", "less", "less_equal", "greater",
          "greater_equal", "isfinite", "isnan", "logical_and", "logical_or", "logical_not", "reciprocal",
          "floor_divide", "sign"}


def _first(inputs):
    return next(x for x in inputs if isinstance(x, ShapeArray))


def ufunc(array, uf, method, inputs, out, kwargs):
    """``uf.method(*inputs, out=out)`` on shapes: ``__call__``, ``reduce`` and ``at``."""
    name = f"numpy.{uf.__name__}" + ("" if method == "__call__" else f".{method}")
    if uf.__name__ not in UFUNCS or method not in ("__call__", "reduce", "at"):
        raise NotSupported(name, [f"numpy.{u}" for u in UFUNCS] + ["numpy.<ufunc>.reduce", "numpy.<ufunc>.at"])
    first = _first(inputs + (out or ()))
    if method == "reduce":
        x = inputs[0]
        if not isinstance(x, ShapeArray):
            raise NoValues(name, first)
        return x._reduce(uf, kwargs.get("axis", 0), kwargs.get("dtype"), out, kwargs.get("keepdims", False))
    if method == "at":
        target, index = inputs[0], inputs[1]
        if not isinstance(target, ShapeArray):
            raise Mixed(name, first, target)
        shape, _, _, _ = target._index(index)
        if len(inputs) > 2:
            s, _ = _operand(inputs[2], name, first)
            broadcast(s, shape)
        target.written()
        return None
    operands = [_operand(x, name, first) for x in inputs]
    shape = broadcast(*(s for s, _ in operands))
    dtypes = _resolve(uf, tuple(_dt(d) for _, d in operands))
    if kwargs.get("dtype") is not None:
        dtypes = (numpy.dtype(kwargs["dtype"]),) * uf.nout
    if out is None:
        results = tuple(ShapeArray(shape, d) for d in dtypes)
    else:
        for o, d in zip(out, dtypes):
            if not isinstance(o, ShapeArray):
                    raise Mixed(name, first, o)
            if broadcast(shape, o.shape) != o.shape:
                raise ValueError(f"{name}: non-broadcastable output operand with shape {o.shape} doesn't match "
                                 f"the broadcast shape {shape}")
            o.written()
        results = tuple(out)
    return results[0] if uf.nout == 1 else results


def _arrays(xs, name):
    xs = list(xs)
    first = _first(xs)
    for x in xs:
        _operand(x, name, first)
    return xs


def _concatenate(arrays, axis=0, out=None, dtype=None):
    arrays = _arrays(arrays, "numpy.concatenate")
    shapes = [getattr(a, "shape", ()) for a in arrays]
    if axis is None:
        shape = (sum(math.prod(s) for s in shapes),)
    else:
        nd = len(shapes[0])
        axis %= nd
        for s in shapes:
            if len(s) != nd or any(s[i] != shapes[0][i] for i in range(nd) if i != axis):
                raise ValueError(f"numpy.concatenate: all the input array dimensions except for the "
                                 f"concatenation axis must match exactly, got shapes {shapes}")
        shape = shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]
    dt = numpy.dtype(dtype) if dtype is not None else numpy.result_type(*(a.dtype for a in arrays))
    return ShapeArray(shape, dt)


def _einsum(subscripts, *operands, out=None, dtype=None, **kwargs):
    operands = _arrays(operands, "numpy.einsum")
    inputs, _, output = subscripts.replace(" ", "").partition("->")
    sizes = {}
    for letters, x in zip(inputs.split(","), operands):
        if "." in letters or len(letters) != x.ndim:
            raise NotSupported(f"numpy.einsum({subscripts!r}) on shapes {[x.shape for x in operands]}",
                               ("explicit subscripts without ellipsis",))
        for c, n in zip(letters, x.shape):
            if sizes.setdefault(c, n) != n and 1 not in (n, sizes[c]):
                raise ValueError(f"numpy.einsum: operands could not be broadcast together for {c!r}")
            sizes[c] = max(sizes[c], n)
    if not _:
        output = "".join(sorted(c for c in set(inputs.replace(",", "")) if inputs.count(c) == 1))
    dt = numpy.dtype(dtype) if dtype is not None else numpy.result_type(*(x.dtype for x in operands))
    return ShapeArray(tuple(sizes[c] for c in output), dt)


def _broadcast_to(array, shape, subok=False):
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if broadcast(array.shape, shape) != shape:
        raise ValueError(f"numpy.broadcast_to: cannot broadcast shape {array.shape} to {shape}")
    strides = [0] * (len(shape) - array.ndim) + [0 if n == 1 and m != 1 else s
                                                 for n, m, s in zip(array.shape, shape[len(shape) - array.ndim:],
                                                                    array.strides_)]
    return array._view(shape, strides, array.offset)


def _like(fill):
    def make(a, dtype=None, order="K", subok=True, shape=None):
        return ShapeArray(a.shape if shape is None else shape, dtype or a.dtype)
    return make


def _stack(arrays, axis=0, out=None, dtype=None):
    arrays = _arrays(arrays, "numpy.stack")
    s = arrays[0].shape
    axis %= len(s) + 1
    return ShapeArray(s[:axis] + (len(arrays),) + s[axis:], numpy.result_type(*(a.dtype for a in arrays)))


FUNCTIONS = {
    numpy.concatenate: _concatenate,
    numpy.einsum: _einsum,
    numpy.broadcast_to: _broadcast_to,
    numpy.ravel: lambda a, order="C": a.ravel(),
    numpy.reshape: lambda a, *args, **kw: a.reshape(*args, **{k: v for k, v in kw.items() if k != "newshape"})
    if "newshape" not in kw else a.reshape(kw["newshape"]),
    numpy.transpose: lambda a, axes=None: a.transpose(*(axes or ())),
    numpy.copy: lambda a, order="K", subok=False: a.copy(),
    numpy.sum: lambda a, axis=None, dtype=None, out=None, keepdims=False, **kw: a.sum(axis, dtype, out, keepdims),
    numpy.zeros_like: _like(0), numpy.empty_like: _like(None), numpy.ones_like: _like(1),
    numpy.ascontiguousarray: lambda a, dtype=None, **kw: (a if a.flags.c_contiguous else a.copy()).astype(
        dtype or a.dtype, copy=False),
    numpy.stack: _stack,
    numpy.shape: lambda a: a.shape,
    numpy.ndim: lambda a: a.ndim,
    numpy.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
}


def function(func, args, kwargs):
    """``func(*args, **kwargs)`` for a NumPy function with a ShapeArray among its arguments."""
    handler = FUNCTIONS.get(func)
    if handler is None:
        raise NotSupported(f"{func.__module__}.{func.__name__}", [f"numpy.{f.__name__}" for f in FUNCTIONS])
    return handler(*args, **kwargs)
