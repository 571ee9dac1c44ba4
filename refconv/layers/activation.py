"""Elementwise layers: any distribution works and nothing moves."""

from refconv.layers.base import Layer


class ReLU(Layer):
    """``max(x, 0)``: elementwise, so any distribution works and nothing moves."""

    def forward(self, x_loc):
        self._check_local(x_loc, self.input_distribution, "x_loc")
        self._x = x_loc
        return self.backend.relu_forward(x_loc)

    def backward(self, dy_loc):
        return self.backend.relu_backward(dy_loc, self._x)

    def records(self):
        """No calls: nothing moves."""
        return []
