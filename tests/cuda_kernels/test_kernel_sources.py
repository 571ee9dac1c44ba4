"""The code that runs is on the page: the written-out stage loops are checked-in files that their generator
still writes, and every kernel and device function has source that ``inspect`` and tracebacks can show."""

import importlib
import inspect
import pkgutil
import traceback

import numpy
import pytest
from numba import cuda

import refconv.kernels
from refconv.kernels import generate, resources
from refconv.kernels.multiply_v2 import multiply_stage


@pytest.mark.parametrize("name", sorted(generate.FILES))
def test_the_generated_loops_are_what_the_generator_writes(name):
    text = (generate.HERE / name).read_text()
    assert text.startswith(generate.HEADER), f"kernels/{name} must open with the generator's header"
    assert text == generate.FILES[name](), f"kernels/{name} is stale: run {generate.COMMAND}"


def test_the_generator_check_names_a_stale_file(tmp_path, monkeypatch, capsys):
    for name, text in generate.FILES.items():
        (tmp_path / name).write_text(text())
    monkeypatch.setattr(generate, "HERE", tmp_path)
    assert generate.main(["--check"]) == 0
    (tmp_path / "multiply_v3.py").write_text(generate.multiply_v3_text().replace("rb + 64]", "rb + 63]"))
    assert generate.main(["--check"]) == 1
    assert "kernels/multiply_v3.py differs" in capsys.readouterr().out


def _module_functions():
    """``(label, object)`` for every ``cuda.jit`` object defined at the top of a module of refconv.kernels."""
    found = []
    for info in pkgutil.iter_modules(refconv.kernels.__path__):
        module = importlib.import_module(f"refconv.kernels.{info.name}")
        for attr, obj in vars(module).items():
            fn = getattr(obj, "py_func", None)
            if hasattr(obj, "forall") and fn is not None and fn.__module__ == module.__name__:
                found.append((f"{info.name}.{attr}", obj))
    return found


def _factory_kernels():
    """The tiled kernels, built per dtype by their cached factories (``resources.KERNELS`` lists them all)."""
    return [(f"{k.label}[{dtype}]", k.dispatcher(numpy.dtype(dtype).type)) for k in resources.KERNELS if k.tiled
            for dtype in k.dtypes]


def test_every_kernel_and_device_function_has_source():
    objects = _module_functions() + _factory_kernels()
    labels = {label for label, _ in objects}
    # the generated loops and the steps around them are among them, not only the hand-written kernels
    assert {"multiply_v2.multiply_stage", "multiply_v3.multiply_half", "loop_v3.gemm_loop", "geometry.split2",
            "conv_forward.forward_direct", "conv_forward.forward_register_tiled[float32]"} <= labels, labels
    assert len(objects) >= 45, labels
    missing = []
    for label, obj in objects:
        try:
            source = inspect.getsource(obj)
        except (OSError, TypeError) as error:
            missing.append(f"{label}: {error}")
            continue
        if f"def {obj.py_func.__name__}(" not in source:
            missing.append(f"{label}: source without its def")
    assert not missing, missing


def test_a_fault_in_a_generated_loop_shows_its_source_line_under_the_simulator():
    @cuda.jit
    def kernel(a_tile, b_tile, acc, a_reg, b_reg):
        multiply_stage(a_tile, b_tile, acc, a_reg, b_reg, 0, 0)

    a_tile = numpy.zeros((16, 1))  # too narrow: the first load past column 0 is out of bounds
    with pytest.raises(IndexError) as raised:
        kernel[1, 1](a_tile, numpy.zeros((16, 64)), numpy.zeros((4, 4)), numpy.zeros(4), numpy.zeros(4))
    shown = "".join(traceback.format_exception(raised.value))
    assert "multiply_v2.py" in shown and "a_reg[ii] = a_tile[0, tx + ii * THREADS]" in shown, shown
