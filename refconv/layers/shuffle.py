"""The shuffle between layers on different grids (docs/algorithms.md section 5)."""

import numpy

from refconv import checks
from refconv.algorithms.base import Call
from refconv.layers.base import KINDS, Layer, layout
from refconv.sharding import plan_shuffle, redistribute


def shuffle_records(shuffle, itemsize):
    """The call of one direction of a :class:`refconv.sharding.Shuffle`: an alltoallv of the
    bytes this rank sends to other ranks, in as many messages as it has non-empty sends."""
    sent = [sum(int(numpy.prod([s.stop - s.start for s in src])) for src, _ in pieces)
            for q, pieces in enumerate(shuffle.sends) if q != shuffle.rank]
    return [Call("alltoallv", len(shuffle.sends), sum(sent) * itemsize, sum(c > 0 for c in sent),
                 axes=("sample", "channel", "height", "width"))]


class Redistribute(Layer):
    """Move a tensor from the layout of one grid to another's (between layers on different grids).

    forward: all-to-all with uneven counts (src -> dst) · backward: the reverse all-to-all

    ``bind`` plans both directions once (``refconv.sharding.plan_shuffle``): the plan is
    pure geometry, milliseconds of Python per call at 64 ranks if made on every call.
    """

    def __init__(self, src_grid, dst_grid, kind="activations", dtype=numpy.float32):
        if src_grid.size != dst_grid.size:
            raise ValueError(f"Redistribute: grids {src_grid.shape} and {dst_grid.shape} have different numbers of ranks")
        if kind not in KINDS[:2]:
            raise ValueError(f"kind: expected 'activations' or 'features', got {kind!r}")
        super().__init__(grid=dst_grid, backend="numpy", dtype=dtype)  # dtype: what moves, for records()
        self.src_grid, self.kind_in, self.kind_out = src_grid, kind, kind

    def bind(self, input_shape):
        shape = checks.activation_shape(input_shape, "input_shape")
        self.src = layout(self.src_grid, shape, self.kind_in)
        self.dst = layout(self.grid, shape, self.kind_out)
        self._input_shape = self._output_shape = shape
        self._forward_plan = plan_shuffle(self.src, self.dst, self.grid.rank)
        self._backward_plan = plan_shuffle(self.dst, self.src, self.grid.rank)
        return self

    @property
    def input_distribution(self):
        self._require_bound()
        return self.src

    def forward(self, x_loc):
        self._require_bound()
        return redistribute(x_loc, self.src, self.dst, self.grid, shuffle=self._forward_plan)

    def backward(self, dy_loc):
        self._require_bound()
        return redistribute(dy_loc, self.dst, self.src, self.grid, shuffle=self._backward_plan)

    def records(self):
        """The calls one forward and backward of this bound layer make on this rank."""
        self._require_bound()
        return shuffle_records(self._forward_plan, self.dtype.itemsize) \
            + shuffle_records(self._backward_plan, self.dtype.itemsize)

    def __repr__(self):
        return f"Redistribute({self.src_grid.shape} -> {self.grid.shape}, {self.kind_in})"
