"""Bad arguments raise ValueError naming the argument and what was expected."""

import numpy
import pytest

from refconv import reference as ref

x = numpy.zeros((2, 4, 6, 6))
w = numpy.zeros((4, 4, 3, 3))
dy = numpy.zeros((2, 4, 4, 4))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: ref.conv2d_forward(x, numpy.zeros((4, 3, 3, 3))), r"w: expected w.shape\[1\] = C/groups = 4"),
        (lambda: ref.conv2d_forward(x, w, numpy.zeros(3)), r"b: expected shape \(4,\)"),
        (lambda: ref.conv2d_forward(x, w, stride=0), r"stride: expected positive"),
        (lambda: ref.conv2d_forward(x, w, stride=(1, -1)), r"stride: expected positive"),
        (lambda: ref.conv2d_forward(x, w, dilation=0), r"dilation: expected positive"),
        (lambda: ref.conv2d_forward(x, w, padding=-1), r"padding: expected non-negative"),
        (lambda: ref.conv2d_forward(x, w, padding=(1, 2, 3)), r"padding: expected an int or an \(h, w\) pair"),
        (lambda: ref.conv2d_forward(x, w, stride=1.5), r"stride: expected an int or an \(h, w\) pair"),
        (lambda: ref.conv2d_forward(x, w, padding="full"), r"padding: expected one of \('same', 'valid'\)"),
        (lambda: ref.conv2d_forward(x[:0], w), r"x_shape: expected 4 positive sizes.*skip the call when a size is 0"),
        (lambda: ref.conv2d_backward_data(dy[:0], w, (0, 4, 6, 6)), r"x_shape: .*refconv does not run empty"),
        (lambda: ref.conv2d_forward(x[0], w), r"x: expected 4 dimensions \(N, C, H, W\).* pass x\[None\]"),
        (lambda: ref.conv2d_forward(x, w, padding_mode="mirror"), r"padding_mode: expected one of"),
        (lambda: ref.conv2d_forward(x, w, padding="same", stride=2),
         r"padding: padding='same' is not supported for strided convolutions.*use stride=1"),
        (lambda: ref.conv2d_forward(x, numpy.zeros((4, 4, 7, 3))), r"kernel: the dilated kernel spans 7 along H"),
        (lambda: ref.conv2d_forward(x, w, dilation=3), r"kernel: the dilated kernel spans 7 along H"),
        (lambda: ref.conv2d_forward(x, numpy.zeros((4, 4, 3, 3)), groups=3), r"groups: 3 does not divide the input channels C=4"),
        (lambda: ref.conv2d_forward(x, numpy.zeros((3, 2, 3, 3)), groups=2), r"groups: 2 does not divide the output channels F=3"),
        (lambda: ref.conv2d_forward(x, w, groups=0), r"groups: expected a positive int"),
        (lambda: ref.conv2d_forward(x[0], w), r"x: expected 4 dimensions"),
        (lambda: ref.conv2d_forward(x, w[0]), r"w: expected 4 dimensions"),
        (lambda: ref.conv2d_forward(x, w.astype(numpy.float32)), r"mixed dtypes"),
        (lambda: ref.conv2d_forward(x.astype(numpy.int64), w), r"x: expected float32 or float64"),
        (lambda: ref.conv2d_backward_data(dy, w, (2, 4, 6)), r"x_shape: expected 4 positive sizes"),
        (lambda: ref.conv2d_backward_data(dy[:, :3], w, x.shape), r"dy: expected shape \(2, 4, 4, 4\)"),
        (lambda: ref.conv2d_backward_data(dy.astype(numpy.float32), w, x.shape), r"mixed dtypes"),
        (lambda: ref.conv2d_backward_filter(x, dy[:, :, :3], w.shape), r"dy: expected shape"),
        (lambda: ref.conv2d_backward_filter(x, dy, (4, 4, 3)), r"w_shape: expected 4 positive sizes"),
        (lambda: ref.conv2d_backward_filter(x, dy, w.shape, stride=0), r"stride: expected positive"),
        (lambda: ref.max_pool2d_forward(x, 2, padding=2), r"padding: expected at most half the kernel size"),
        (lambda: ref.max_pool2d_forward(x, 0), r"kernel_size: expected positive"),
        (lambda: ref.avg_pool2d_forward(x, 7), r"kernel: the dilated kernel spans 7"),
        (lambda: ref.batch_norm_forward(x, numpy.ones(3), numpy.zeros(4)), r"gamma: expected shape \(4,\)"),
        (lambda: ref.linear_forward(numpy.zeros((2, 3)), numpy.zeros((5, 4))), r"w: expected 3 input features"),
        (lambda: ref.softmax_cross_entropy_forward(numpy.zeros((2, 3)), numpy.array([0, 3])), r"labels: expected values in \[0, 3\)"),
        (lambda: ref.softmax_cross_entropy_forward(numpy.zeros((2, 3)), numpy.array([0.0, 1.0])), r"labels: expected 2 integer labels"),
    ],
)
def test_invalid_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()
