"""The shuffle between layers on different grids (docs/algorithms.md section 5)."""

from refconv import checks
from refconv.layers.base import KINDS, Layer, layout
from refconv.sharding import redistribute


class Redistribute(Layer):
    """Move a tensor from the layout of one grid to another's (between layers on different grids).

    forward: all-to-all with uneven counts (src -> dst) · backward: the reverse all-to-all
    """

    def __init__(self, src_grid, dst_grid, kind="activations"):
        if src_grid.size != dst_grid.size:
            raise ValueError(f"Redistribute: grids {src_grid.shape} and {dst_grid.shape} have different numbers of ranks")
        if kind not in KINDS[:2]:
            raise ValueError(f"kind: expected 'activations' or 'features', got {kind!r}")
        super().__init__(grid=dst_grid, backend="numpy")
        self.src_grid, self.kind_in, self.kind_out = src_grid, kind, kind

    def bind(self, input_shape):
        shape = checks.shape4(input_shape, "input_shape")
        self.src = layout(self.src_grid, shape, self.kind_in)
        self.dst = layout(self.grid, shape, self.kind_out)
        self._input_shape = self._output_shape = shape
        return self

    @property
    def input_distribution(self):
        self._require_bound()
        return self.src

    def forward(self, x_loc):
        return redistribute(x_loc, self.src, self.dst, self.grid)

    def backward(self, dy_loc):
        return redistribute(dy_loc, self.dst, self.src, self.grid)

    def __repr__(self):
        return f"Redistribute({self.src_grid.shape} -> {self.grid.shape}, {self.kind_in})"
