"""refconv.datasets' .npy readers: two threads parsing headers at once, the race CI met, made certain.

CPython 3.11's AST builder (numpy parses every .npy header with ast.literal_eval) keeps its
recursion count in state every thread shares.  CI met it once, in checkpoint.load on 2 simulated
ranks; 8 threads parsing in a loop here meet it about once in 25,000 parses.  A garbage collection
inside thread A's parse runs a finalizer, the interpreter switches to thread B, B's parse resets
the count, and A's ends in ``SystemError: AST constructor recursion depth mismatch``.  Here a
finalizer makes that switch every time: it runs when a collection falls inside ``ast.parse`` (the
collector is set to run at every allocation) and hands over to thread B, which parses a header
from a deeper stack and hands back.  Unlocked, every parse of A fails (the control); through
datasets.read_npy_header, B waits for the lock, A's hand-over times out, and nothing fails.
"""

import gc
import io
import queue
import sys
import threading

import numpy
import pytest

from refconv import datasets

HEADER = io.BytesIO()
numpy.save(HEADER, numpy.zeros((2, 3), dtype=numpy.float32))
NPY = HEADER.getvalue()
PARSES = 3
WAIT_S = 1.0       # far longer than B's parse; the locked case waits it out PARSES times


def _unlocked_header(f):
    numpy.lib.format.read_magic(f)
    return numpy.lib.format.read_array_header_1_0(f)


def _deeper(levels, fn):
    """fn() called ``levels`` Python frames further down: B's parse starts its count elsewhere."""
    return fn() if levels == 0 else _deeper(levels - 1, fn)


class _HandOver:
    """Thread A's side: garbage whose finalizer, run by a collection inside ast.parse, asks thread B
    to parse once and waits for it, at most WAIT_S (B cannot parse while A holds the lock)."""

    def __init__(self, read):
        self.read, self.armed, self.handed = read, False, 0
        self.requests, self.stop = queue.Queue(), threading.Event()
        self.b_errors = []

    def garbage(self):
        hand_over = self

        class Cycle:
            def __del__(self):
                if hand_over.armed and sys._getframe(1).f_code.co_name == "parse":
                    hand_over.armed = False
                    hand_over.handed += 1
                    parsed = threading.Event()    # this hand-over's own: a late answer cannot end the next wait
                    hand_over.requests.put(parsed)
                    parsed.wait(WAIT_S)
                elif hand_over.armed:
                    hand_over.garbage()       # collected before the parse: leave some for it

        cycle = Cycle()
        cycle.self = cycle

    def thread_b(self):
        while not self.stop.is_set():
            try:
                parsed = self.requests.get(timeout=0.01)
            except queue.Empty:
                continue
            try:
                _deeper(30, lambda: self.read(io.BytesIO(NPY)))
            except SystemError as exc:
                self.b_errors.append(exc)
            parsed.set()


def _race(read):
    """(A's SystemErrors, hand-overs made, B's SystemErrors, headers A read) for PARSES parses."""
    hand_over, a_errors, headers = _HandOver(read), [], []
    b = threading.Thread(target=hand_over.thread_b)
    b.start()
    threshold = gc.get_threshold()
    gc.set_threshold(1, 1_000_000, 1_000_000)      # a young collection at every allocation, no older ones
    try:
        for _ in range(PARSES):
            hand_over.armed = True
            hand_over.garbage()
            try:
                headers.append(read(io.BytesIO(NPY)))
            except SystemError as exc:
                a_errors.append(exc)
            hand_over.armed = False
    finally:
        gc.set_threshold(*threshold)
        hand_over.stop.set()
        b.join()
        gc.collect()
    return a_errors, hand_over.handed, hand_over.b_errors, headers


@pytest.mark.skipif(sys.version_info[:2] != (3, 11), reason="the shared AST recursion count is CPython 3.11's")
def test_the_race_is_real_without_the_lock():
    """The control: unlocked, each of A's parses is interrupted by B's and fails.  If CPython
    mends the race in 3.11, this test fails and says so, and the lock in refconv/datasets.py can go."""
    a_errors, handed, _, _ = _race(_unlocked_header)
    assert handed == PARSES, f"the finalizer handed over {handed} times in {PARSES} parses"
    assert len(a_errors) == PARSES and all("recursion depth mismatch" in str(e) for e in a_errors), a_errors


def test_read_npy_header_is_safe_while_another_thread_parses():
    a_errors, handed, b_errors, headers = _race(datasets.read_npy_header)
    assert handed == PARSES and not a_errors and not b_errors, (handed, a_errors, b_errors)
    assert headers == [((2, 3), False, numpy.dtype(numpy.float32))] * PARSES


def test_load_arrays_and_archive_member_read_what_numpy_wrote(tmp_path):
    numpy.savez(tmp_path / "a.npz", x=numpy.arange(6).reshape(2, 3), y=numpy.array([1, 0]))
    numpy.save(tmp_path / "y.npy", numpy.array([3, 4, 5]))
    z = datasets.load_arrays(tmp_path / "a.npz")
    assert sorted(z) == ["x", "y"] and z["x"].tolist() == [[0, 1, 2], [3, 4, 5]] and z["y"].tolist() == [1, 0]
    assert datasets.load_arrays(tmp_path / "y.npy").tolist() == [3, 4, 5]
    with numpy.load(tmp_path / "a.npz") as archive:
        assert datasets.archive_member(archive, "y").tolist() == [1, 0]


def test_read_header_refuses_a_version_numpy_cannot_read():
    bad = bytearray(NPY)
    bad[6] = 9                                    # the major version byte after b"\x93NUMPY"
    with pytest.raises(ValueError, match=r"unsupported \.npy version \(9, 0\); numpy.save writes 1.0 or 2.0"):
        datasets.read_npy_header(io.BytesIO(bytes(bad)))
