"""ShapeArray (refconv.shapes): the shape and dtype NumPy gives for each operation the code uses, views and
copies, versions bumped by every write, and the errors for values asked for, arrays mixed and operations
not supported."""

import numpy
import pytest

from refconv.backend import NumpyBackend, get_backend
from refconv.shapes import Mixed, NotSupported, NoValues, ShapeArray
from refconv.shapes.namespace import xp

IDX = numpy.arange(3)
OPS = [lambda a, b: a + b, lambda a, b: a * 2.0, lambda a, b: 1 - a, lambda a, b: a / b, lambda a, b: a > b,
       lambda a, b: a[:, 1:3, ::2], lambda a, b: a[0], lambda a, b: a[..., 1], lambda a, b: a[:, :, IDX[:, None], IDX],
       lambda a, b: a[IDX[:2], :, 0], lambda a, b: a.reshape(2, -1), lambda a, b: a.transpose(1, 0, 2, 3),
       lambda a, b: a.T, lambda a, b: a.sum(axis=(0, 2), keepdims=True), lambda a, b: a.max(axis=1),
       lambda a, b: numpy.einsum("ncs->c", a.reshape(2, 3, -1)), lambda a, b: numpy.sqrt(b),
       lambda a, b: numpy.exp(a - b), lambda a, b: numpy.concatenate([a, a], axis=1),
       lambda a, b: numpy.broadcast_to(b, (2, 3, 4, 5)), lambda a, b: a.astype(numpy.float64),
       lambda a, b: a.reshape(6, 20).T @ a.reshape(6, 20), lambda a, b: a * numpy.float64(2),
       lambda a, b: numpy.maximum(a, 0), lambda a, b: numpy.isfinite(a), lambda a, b: a.astype(numpy.int32) + 1]


@pytest.mark.parametrize("op", range(len(OPS)))
def test_each_operation_gives_numpys_shape_and_dtype(op):
    a, b = numpy.ones((2, 3, 4, 5), numpy.float32), numpy.ones((1, 3, 1, 1), numpy.float32)
    real = OPS[op](a, b)
    fake = OPS[op](xp.asarray(a), xp.asarray(b))
    assert isinstance(fake, ShapeArray) and (fake.shape, fake.dtype) == (real.shape, real.dtype)


def test_views_share_the_root_and_writes_bump_its_version():
    a = xp.zeros((4, 6), numpy.float32)
    v = a[1:3]
    assert v.root is a and v.flags.c_contiguous and not a[:, 1:3].flags.c_contiguous
    assert a.reshape(24).root is a and a[:, 1:3].reshape(-1).root is not a   # a copy, as NumPy's
    before = a.version
    v += 1
    a[0] = 2
    numpy.add(a, 1, out=a)
    numpy.add.at(a, (IDX,), 1)
    a[...] = xp.zeros((6,), numpy.float32)
    get_backend("shapes").bias_add(a.reshape(1, 4, 6, 1), xp.zeros((4,), numpy.float32))
    assert a.version == before + 6


@pytest.mark.parametrize("need, name", [(float, "float()"), (int, "int()"), (bool, "bool()"),
                                        (numpy.asarray, "numpy.asarray"), (lambda x: x.item(), "item()"),
                                        (lambda x: f"{x:.4f}", "format"), (lambda x: x.tolist(), "tolist()")])
def test_what_needs_a_value_raises_naming_the_operation_and_the_caller(need, name):
    with pytest.raises(NoValues, match=rf"{name}.*shape \(1,\) float32.*test_shapes_array.py"):
        need(xp.zeros((1,), numpy.float32))
    assert repr(xp.zeros((1,), numpy.float32)) == "ShapeArray((1,), float32)"


def test_a_numpy_array_mixed_in_is_refused_naming_the_operation_and_a_scalar_is_not():
    x = xp.zeros((3,), numpy.float32)
    with pytest.raises(Mixed, match="numpy.add"):
        x + numpy.ones(3, numpy.float32)
    with pytest.raises(Mixed, match="numpy.concatenate"):
        numpy.concatenate([x, numpy.ones(3, numpy.float32)])
    with pytest.raises(Mixed, match="__setitem__"):
        x[...] = numpy.ones(3, numpy.float32)
    assert (x + numpy.float32(2)).shape == (x * numpy.array(2.0, numpy.float32)).shape == (3,)
    with pytest.raises(NotSupported, match="numpy.fft.fft"):
        numpy.fft.fft(x)
    with pytest.raises(ValueError, match="broadcast"):
        x + xp.zeros((4,), numpy.float32)


def test_the_shapes_backend_overrides_every_public_method_of_the_numpy_backend():
    shapes = type(get_backend("shapes"))
    public = {n for n in dir(NumpyBackend) if not n.startswith("_") and callable(getattr(NumpyBackend, n))}
    assert public and {n for n in public if getattr(shapes, n) is getattr(NumpyBackend, n)} == set()


@pytest.mark.parametrize("dims", [2, 3])
def test_the_shapes_backend_gives_the_numpy_backends_shapes(dims):
    rng = numpy.random.default_rng(0)
    real, fake = NumpyBackend(), get_backend("shapes")
    x = rng.standard_normal((2, 4) + (7,) * dims).astype(numpy.float32)
    w = rng.standard_normal((6, 2) + (3,) * dims).astype(numpy.float32)
    conv = "conv2d" if dims == 2 else "conv3d"
    pool = "max_pool2d" if dims == 2 else "max_pool3d"
    kw = dict(stride=2, padding=1, groups=2)
    y = getattr(real, f"{conv}_forward")(x, w, **kw)
    calls = [(f"{conv}_forward", (x, w), kw), (f"{conv}_backward_data", (y, w, x.shape), kw),
             (f"{conv}_backward_filter", (x, y, w.shape), kw), (f"{pool}_forward", (x, 2), {}),
             ("relu_forward", (x,), {}), ("batch_norm_sum", (x,), {})]
    for name, args, kwargs in calls:
        want = getattr(real, name)(*args, **kwargs)
        got = getattr(fake, name)(*(xp.asarray(a) if isinstance(a, numpy.ndarray) else a for a in args), **kwargs)
        for r, f in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
            assert (f.shape, f.dtype) == (r.shape, r.dtype), name
