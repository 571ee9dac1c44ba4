"""``xp``: the array module of shapes-only arrays, for the functions that make arrays (``numpy.zeros`` and
the like do not dispatch on their arguments).  Index helpers (``arange``, ``ix_``) return real NumPy
arrays: geometry has values.  Ufuncs are NumPy's own, which dispatch through ``__array_ufunc__``."""

import numpy

from refconv.shapes import dispatch
from refconv.shapes.array import ShapeArray
from refconv.shapes.errors import NoValues


def _shape(shape):
    return tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)


class Namespace:
    """A module-like object (see the module docstring); an unknown name is an AttributeError listing the rest."""

    __name__ = "refconv.shapes"
    ndarray = ShapeArray
    index_module = numpy            # index arrays (halo windows, Distribution.index) stay NumPy arrays
    arange, ix_ = staticmethod(numpy.arange), staticmethod(numpy.ix_)
    float32, float64, int64, int32, uint8, bool_, dtype, newaxis = (numpy.float32, numpy.float64, numpy.int64,
                                                                     numpy.int32, numpy.uint8, numpy.bool_,
                                                                     numpy.dtype, None)

    def __init__(self):
        for name in dispatch.UFUNCS:
            setattr(self, name, getattr(numpy, name))
        for func, handler in dispatch.FUNCTIONS.items():
            setattr(self, func.__name__, handler)

    @staticmethod
    def empty(shape, dtype=float, order="C"):
        return ShapeArray(_shape(shape), dtype)

    zeros = ones = empty

    @staticmethod
    def full(shape, fill_value, dtype=None, order="C"):
        return ShapeArray(_shape(shape), dtype if dtype is not None else numpy.result_type(fill_value))

    @staticmethod
    def asarray(x, dtype=None, order=None, copy=None):
        """A ShapeArray as it is (or cast); anything with a shape and dtype (a NumPy array) as a new root."""
        if isinstance(x, ShapeArray):
            return x.astype(dtype, copy=False) if dtype is not None else x
        x = numpy.asarray(x)
        return ShapeArray(x.shape, dtype if dtype is not None else x.dtype)

    @staticmethod
    def array(x, dtype=None, copy=True, order="K"):
        if isinstance(x, ShapeArray) and not copy:
            return Namespace.asarray(x, dtype)
        return ShapeArray(numpy.shape(x) if not isinstance(x, ShapeArray) else x.shape,
                          dtype if dtype is not None else (x.dtype if hasattr(x, "dtype") else numpy.asarray(x).dtype))

    @staticmethod
    def count_nonzero(x, axis=None):
        raise NoValues("numpy.count_nonzero", x)

    def __getattr__(self, name):
        # probed often (getattr(x, "root", None) on a layer's attributes): the list of names is made once
        if name == "_supported":
            raise AttributeError(name)
        if "_supported" not in self.__dict__:
            self._supported = ", ".join(sorted(n for n in dir(self) if not n.startswith("_")))
        raise AttributeError(f"refconv.shapes has no {name!r}: shapes-only arrays support {self._supported}")


xp = Namespace()
