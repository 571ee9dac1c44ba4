"""The device check's kernel rows: one (shape, pass) at a time, every version, checked then timed.

A row is ``{"shape", "pass", "gflop", "v1_ms", "v2_ms", "v3_ms"[, "cudnn_ms", "sgemm_ms", "v2_of_cudnn",
"v2_of_sgemm", "v3_of_cudnn", "v3_of_sgemm"], "worst_error"}``, or the same with ``"error"`` when a version fails its check or
raises: the next row runs regardless (``scripts/gpu_check_jobs.py`` writes each row as it comes).
"""

import time

import numpy

from refconv import kernels, reference
from refconv.kernels.resource_tables import gemm_dims
from refconv.testing.asserts import assert_close

PASSES = ("forward", "backward-data", "backward-filter")


class KernelRows:
    """Rows for ``batch`` samples; ``rounds`` timed calls (median) after a warm-up, when ``timed``."""

    def __init__(self, arrays, batch, rounds, timed):
        self.arrays, self.batch, self.rounds, self.timed = arrays, batch, rounds, timed
        self.on_gpu = arrays.gpu_available()
        self.xp = arrays.device_module()
        self.notes = []
        self.torch = None
        if not self.on_gpu:
            self.notes.append("cuDNN and cuBLAS: no GPU (dry run), so only refconv's kernels ran, timed by the wall clock")
            return
        try:
            import torch
        except ImportError:
            self.notes.append("cuDNN: torch is not installed")
            return
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
        self.torch = torch

    def median_seconds(self, fn, events):
        """``fn``'s median time over ``rounds`` calls after one warm-up (which compiles), by ``events`` if given."""
        fn()
        times = []
        for _ in range(self.rounds):
            if events is None:
                self.arrays.synchronize()
                t0 = time.perf_counter()
                fn()
                self.arrays.synchronize()
                times.append(time.perf_counter() - t0)
                continue
            start, end = events()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 if hasattr(start, "elapsed_time")
                         else self.xp.cuda.get_elapsed_time(start, end) / 1e3)
        return sorted(times)[len(times) // 2]

    def rows(self, name, shape, dims=2, batch=None):
        """Yield the three rows of one shape ``(C, F, H, K, stride, padding)``: square images (``dims=2``) or
        cubic volumes (``dims=3``) of side ``H``; ``batch`` samples (default: the table's)."""
        C, F, H, K, stride, padding = shape
        N, xp = batch or self.batch, self.xp
        rng = numpy.random.default_rng(0)
        Ho = (H + 2 * padding - K) // stride + 1
        x = rng.standard_normal((N, C) + (H,) * dims, dtype=numpy.float32)
        w = rng.standard_normal((F, C) + (K,) * dims, dtype=numpy.float32)
        dy = rng.standard_normal((N, F) + (Ho,) * dims, dtype=numpy.float32)
        g = dict(stride=stride, padding=padding)
        xd, wd, dyd = (xp.asarray(a) for a in (x, w, dy))
        reduction = {"forward": C * K ** dims, "backward-data": F * K ** dims, "backward-filter": N * Ho ** dims}
        conv = {name: getattr(reference, f"conv{dims}d_{name}") for name in ("forward", "backward_data",
                                                                               "backward_filter")}
        mine = {name: getattr(kernels, f"conv{dims}d_{name}") for name in conv}
        for pass_ in PASSES:
            row = {"shape": name, "dims": dims, "batch": N, "pass": pass_,
                   "gflop": 2.0 * N * F * Ho ** dims * C * K ** dims / 1e9}
            try:
                expected = {"forward": lambda: conv["forward"](x, w, **g),
                            "backward-data": lambda: conv["backward_data"](dy, w, x.shape, **g),
                            "backward-filter": lambda: conv["backward_filter"](x, dy, w.shape, **g)}[pass_]()
                worst = 0.0
                for version in kernels.VERSIONS:
                    call = {"forward": lambda: mine["forward"](xd, wd, version=version, **g),
                            "backward-data": lambda: mine["backward_data"](dyd, wd, x.shape, version=version, **g),
                            "backward-filter": lambda: mine["backward_filter"](xd, dyd, w.shape, version=version,
                                                                               **g)}[pass_]
                    self.arrays.synchronize()
                    t0 = time.perf_counter()
                    got = call()
                    self.arrays.synchronize()
                    checked_s = time.perf_counter() - t0
                    got = self.arrays.to_host(got)
                    assert_close(got, expected, reduction_length=reduction[pass_])
                    worst = max(worst, float(numpy.max(numpy.abs(got - expected))))
                    row[f"v{version}_ms"] = (self.median_seconds(call, self.cupy_events()) if self.timed
                                             else checked_s) * 1e3
                row["worst_error"] = worst
                self.contenders(row, pass_, x, w, dy, g, rng, dims)
            except Exception as error:  # noqa: BLE001 (one failing row is a finding; the next row still runs)
                row["error"] = f"{type(error).__name__}: {' '.join(str(error).split())[:300]}"
            yield row

    def cupy_events(self):
        return (lambda: (self.xp.cuda.Event(), self.xp.cuda.Event())) if self.on_gpu else None

    def contenders(self, row, pass_, x, w, dy, g, rng, dims):
        """cuDNN (torch, TF32 off) on the same pass, and cuBLAS SGEMM (CuPy) on the pass's own GEMM."""
        if self.torch is not None:
            torch = self.torch
            xt, wt, dyt = (torch.as_tensor(a, device="cuda") for a in (x, w, dy))
            forward, data, weight = (getattr(torch.nn.functional, f"conv{dims}d"),
                                     getattr(torch.nn.grad, f"conv{dims}d_input"),
                                     getattr(torch.nn.grad, f"conv{dims}d_weight"))
            base = {"forward": lambda: forward(xt, wt, **g),
                    "backward-data": lambda: data(xt.shape, wt, dyt, **g),
                    "backward-filter": lambda: weight(xt, wt.shape, dyt, **g)}[pass_]
            events = lambda: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))  # noqa: E731
            row["cudnn_ms"] = self.median_seconds(base, events) * 1e3
            for version in (2, 3):
                row[f"v{version}_of_cudnn"] = row["cudnn_ms"] / row[f"v{version}_ms"]
        if self.on_gpu:
            (N, C, H), (F, K) = x.shape[:3], (w.shape[0], w.shape[2])
            M, Ng, depth = gemm_dims(pass_, N, C, F, H, K, g["stride"], g["padding"], dims)
            a = self.xp.asarray(rng.standard_normal((M, depth), dtype=numpy.float32))
            b = self.xp.asarray(rng.standard_normal((depth, Ng), dtype=numpy.float32))
            row["sgemm_ms"] = self.median_seconds(lambda: self.xp.matmul(a, b), self.cupy_events()) * 1e3
            for version in (2, 3):
                row[f"v{version}_of_sgemm"] = row["sgemm_ms"] / row[f"v{version}_ms"]
