"""Exercise 13's checker: your kernel under Numba's CUDA simulator against the reference, and each thread's
loads under the counting fake (:mod:`tutorials.exercises.counting`, the same kernel source) against the budget."""

import dataclasses

import numpy
from hypothesis import strategies as st
from numba import cuda

from refconv import reference as ref
from tutorials.exercises import counting
from tutorials.exercises import score as scoring
from tutorials.exercises.harness import Compared, Part

TITLE = "a kernel puzzle: a tiled convolution, scored by loads per thread"
LEVEL, MINUTES = 3, 60  # difficulty 1 to 3, and a learner's time
GLOBAL_LOADS = 3  # per thread: its share of the input tile (at most 2 cells of 10 x 10 for 64 threads) and 1 weight
SHARED_LOADS_PER_TAP = 2  # per thread and tap a, b: x_tile and w_tile


@dataclasses.dataclass(frozen=True)
class KernelCase:
    H: int
    W: int
    K: int

    def arrays(self):
        rng = numpy.random.default_rng(0)
        return (rng.standard_normal((self.H, self.W)).astype(numpy.float32),
                rng.standard_normal((self.K, self.K)).astype(numpy.float32))

    @property
    def out(self):
        return self.H - self.K + 1, self.W - self.K + 1

    def __str__(self):
        return f"x ({self.H}, {self.W}), w ({self.K}, {self.K}), y {self.out}"


@st.composite
def kernel_cases(draw):
    K = draw(st.integers(1, 3))
    return KernelCase(draw(st.integers(K, K + 17)), draw(st.integers(K, K + 17)), K)


def run_launch(module, case):
    Ho, Wo = case.out
    T = module.TILE
    got = module.launch(Ho, Wo)
    want = ((-(-Ho // T), -(-Wo // T)), (T, T))
    return [Compared("launch(Ho, Wo): (blocks, threads)", [numpy.array(got, dtype=object).tolist().__str__()],
                     [str(numpy.array(want, dtype=object).tolist())], exact=True)]


def _launch(case):
    Ho, Wo = case.out
    return ((-(-Ho // 8), -(-Wo // 8)), (8, 8))


def run_kernel(module, case):
    x, w = case.arrays()
    blocks, threads = _launch(case)
    counting.run(module.conv_tile_kernel, blocks, threads, x, w, numpy.zeros(case.out, numpy.float32))  # todo first
    y = numpy.zeros(case.out, numpy.float32)
    cuda.jit(module.conv_tile_kernel)[blocks, threads](x, w, y)
    want = ref.conv2d_forward(x[None, None].astype(numpy.float64), w[None, None].astype(numpy.float64))[0, 0]

    def one_at_a_time():  # the threads of a block in turn, in two orders: a missing barrier shows
        out = []
        for order in ("forward", "reverse"):
            y_run = numpy.zeros(case.out, numpy.float32)
            counting.run(module.conv_tile_kernel, blocks, threads, x, w, y_run, order=order)
            out.append([y_run])
        return out
    # float32 against the float64 reference rounded to float32: the tolerance is float32's
    return [Compared("y", [y], [want.astype(numpy.float32)], reduction=case.K * case.K, label="launch",
                     reruns=one_at_a_time)]


def per_block(counts, blocks, threads, space, what):
    """``[block: (threads.x, threads.y) array of the loads (or stores)]``."""
    out = {}
    for (b, t), c in counts.items():
        out.setdefault(b[:2], numpy.zeros(threads, dtype=int))[t[:2]] = c.get((space, what), 0)
    return [out[b] for b in sorted(out)]


def run_loads(module, case):
    x, w = case.arrays()
    blocks, threads = _launch(case)
    counts = counting.run(module.conv_tile_kernel, blocks, threads, x, w, numpy.zeros(case.out, numpy.float32))
    over = []
    for space, budget in (("global", GLOBAL_LOADS), ("shared", SHARED_LOADS_PER_TAP * case.K * case.K)):
        loads = per_block(counts, blocks, threads, space, "loads")
        over.append(Compared(f"{space} loads past the budget", [numpy.maximum(a - budget, 0) for a in loads],
                             [numpy.zeros_like(a) for a in loads], exact=True, label="block",
                             note=f"{budget} a thread; per block, threadIdx.x down and threadIdx.y across"))
    return over


PARTS = [Part("launch", kernel_cases(), run_launch, str), Part("conv_tile_kernel", kernel_cases(), run_kernel, str),
         Part("loads per thread", kernel_cases(), run_loads, str)]

SCORE_CASE = KernelCase(19, 21, 3)


def score(module, solution):
    lines = [f"score on {SCORE_CASE} (the reference solution's in brackets): per thread, the most and the mean"]
    x, w = SCORE_CASE.arrays()
    blocks, threads = _launch(SCORE_CASE)
    counted = [counting.run(m.conv_tile_kernel, blocks, threads, x, w, numpy.zeros(SCORE_CASE.out, numpy.float32))
               for m in (module, solution)]
    pairs = []
    for space in ("global", "shared"):
        for what in ("loads", "stores"):
            a, b = ([c.get((space, what), 0) for c in counts.values()] for counts in counted)
            lines.append(f"  {space} {what:6}  most {max(a)} ({max(b)}), "
                         f"mean {numpy.mean(a):.2f} ({numpy.mean(b):.2f})")
            pairs.append((what, max(a), max(b), f" ({space} {what}, the busiest thread)"))
    return lines + ["  " + scoring.verdict(pairs)]
