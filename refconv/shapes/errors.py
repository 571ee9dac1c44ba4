"""The errors of shapes-only arrays: a value asked for, a real array mixed in, an operation not supported."""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def caller():
    """``file:line in function`` of the first frame outside refconv/shapes (read only when raising)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _HERE:
        frame = frame.f_back
    if frame is None:
        return "unknown place"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


class NoValues(TypeError):
    """An operation needs the values of a shapes-only array, which has none."""

    def __init__(self, operation, array):
        super().__init__(f"{operation} needs the values of a shapes-only array ({_describe(array)}), which has "
                         f"none (at {caller()}); a shapes-only run checks shapes, calls, bytes and memory: run "
                         f"with backend='numpy' for values")


class Mixed(TypeError):
    """A shapes-only array meets an array with values in one operation."""

    def __init__(self, operation, array, other):
        super().__init__(f"{operation}: a shapes-only array ({_describe(array)}) cannot be combined with a "
                         f"{type(other).__name__} of shape {getattr(other, 'shape', '?')} (values) (at "
                         f"{caller()}); convert it with backend.asarray first")


class NotSupported(TypeError):
    """An operation shapes-only arrays do not implement."""

    def __init__(self, operation, supported):
        super().__init__(f"{operation} is not supported on shapes-only arrays (at {caller()}); supported: "
                         f"{', '.join(sorted(supported))}")


def _describe(array):
    if isinstance(array, str):      # a description ("the model's outputs") where there is no one array
        return array
    return f"shape {tuple(array.shape)} {array.dtype}" if hasattr(array, "shape") else type(array).__name__
