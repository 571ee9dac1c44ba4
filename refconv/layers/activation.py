"""Elementwise layers: any distribution works and nothing moves."""

from refconv.layers.base import Layer


class ReLU(Layer):
    """``max(x, 0)``: elementwise, so any distribution works and nothing moves; images
    ``(N, C, H, W)`` or volumes ``(N, C, D, H, W)`` alike."""

    def bind(self, input_shape):
        self.ndim = 5 if len(input_shape) == 5 else 4  # of this input: elementwise, either works
        return super().bind(input_shape)

    def forward(self, x_loc):
        self._check_local(x_loc, self.input_distribution, "x_loc")
        self._x = x_loc
        return self.backend.relu_forward(x_loc)

    def backward(self, dy_loc):
        return self.backend.relu_backward(dy_loc, self._x)

    def records(self):
        """No calls: nothing moves."""
        return []
