"""A thread's CPU time split by category, by wrapping the functions at each category's border.

::

    with thread_cpu.wrapped({"backend": [(ShapesBackend, None)], "collectives": [(collectives, names)]}):
        thread_cpu.start()                 # in each thread to be measured
        ...                                # the work
        figures = thread_cpu.stop()        # {"total": s, "seconds": {category: s}, "calls": n}

A wrapped function, called from a thread that has started and from outside its own category,
reads ``time.thread_time`` on entry and on exit and gives the time between two readings to the
category then running: time is exclusive (a collective's time inside the simulator is the
simulator's), and what runs outside every wrapped function is :data:`REST`'s.  The readings
telescope, so the categories add up to ``total`` exactly.  A call from inside its own category,
or from a ``bottom`` category (:func:`start`) to another, passes straight through, and a thread that has not started pays one attribute lookup per call.

Why wrappers and not a per-thread profiler (``threading.setprofile``): a profiler runs a
callback on every Python call and return and every C call, millions per rank-step, which
multiplies the step's time and inflates the categories made of many small calls the most;
wrappers run only where the category changes.  What they cost is measured by :func:`overhead`
and left in the figures (``calls`` of them).
"""

import contextlib
import functools
import inspect
import threading
import time

REST = "bookkeeping"
_local = threading.local()
_thread_time = time.thread_time


class _State:
    __slots__ = ("current", "last", "start", "seconds", "calls", "bottom")

    def __init__(self, now, bottom):
        self.current, self.last, self.start, self.seconds, self.calls = REST, now, now, {REST: 0.0}, 0
        self.bottom = frozenset(bottom)


def start(bottom=()):
    """Start the calling thread's account (anew).  ``bottom``: categories of the lowest layer, whose
    calls into the others stay theirs (a simulator's work on the arrays it delivers is the
    simulator's); a call from one of them to another still switches."""
    _local.state = _State(_thread_time(), bottom)


def stop():
    """End the calling thread's account: ``{"total", "seconds": {category: s}, "calls"}``."""
    state = getattr(_local, "state", None)
    if state is None:
        raise RuntimeError("thread_cpu.stop: this thread has not called thread_cpu.start()")
    now = _thread_time()
    state.seconds[state.current] = state.seconds.get(state.current, 0.0) + now - state.last
    _local.state = None
    return {"total": now - state.start, "seconds": dict(state.seconds), "calls": state.calls}


def timed(fn, category):
    """``fn``, its time given to ``category`` in threads that have started."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        state = getattr(_local, "state", None)
        if state is None or state.current == category or (state.current in state.bottom
                                                           and category not in state.bottom):
            return fn(*args, **kwargs)
        now = _thread_time()
        outer = state.current
        state.seconds[outer] = state.seconds.get(outer, 0.0) + now - state.last
        state.last, state.current = now, category
        state.calls += 1
        try:
            return fn(*args, **kwargs)
        finally:
            now = _thread_time()
            state.seconds[category] = state.seconds.get(category, 0.0) + now - state.last
            state.last, state.current = now, outer
    return call


def _wrap_attribute(raw, category):
    """A class or module attribute, wrapped the way it is bound (function, static, class, property);
    None for what is not code (a constant, a class)."""
    if isinstance(raw, staticmethod):
        return staticmethod(timed(raw.__func__, category))
    if isinstance(raw, classmethod):
        return classmethod(timed(raw.__func__, category))
    if isinstance(raw, property):
        return property(*(None if f is None else timed(f, category) for f in (raw.fget, raw.fset, raw.fdel)),
                        raw.__doc__)
    if inspect.isfunction(raw) or inspect.isbuiltin(raw):
        return timed(raw, category)
    return None


def _names(owner):
    """Every attribute of a class (its own and inherited, dunders included) or the public names of a module."""
    if inspect.isclass(owner):
        return [n for n in dir(owner) if n not in ("__class__", "__new__", "__init_subclass__", "__subclasshook__",
                                                    "__getattribute__", "__setattr__", "__delattr__", "__dir__",
                                                    "__reduce__", "__reduce_ex__", "__sizeof__", "__getstate__")]
    return getattr(owner, "__all__", None) or [n for n in vars(owner) if not n.startswith("_")]


@contextlib.contextmanager
def wrapped(targets):
    """While the block runs, the attributes named of each owner (a class, a module, an instance) wrapped
    by :func:`timed` for their category; ``targets``: ``{category: [(owner, names or None), ...]}``
    (None: every method of a class, every public function of a module).  Restored after, as they were."""
    undo = []
    try:
        for category, owners in targets.items():
            for owner, names in owners:
                for name in names if names is not None else _names(owner):
                    own = vars(owner) if not isinstance(owner, type) and hasattr(owner, "__dict__") else owner.__dict__
                    had = name in own
                    raw = own[name] if had else inspect.getattr_static(owner, name)
                    new = _wrap_attribute(raw, category)
                    if new is None:
                        continue
                    setattr(owner, name, new)
                    undo.append((owner, name, had, raw))
        yield
    finally:
        for owner, name, had, raw in reversed(undo):
            if had:
                setattr(owner, name, raw)
            else:
                delattr(owner, name)


def overhead(calls=20000):
    """Seconds one wrapped call costs beyond the call itself, where the category changes (this thread,
    least of 3 tries): what the figures carry per counted call."""
    def plain():
        return None
    wrapped_ = timed(plain, "calibration")
    best = float("inf")
    for _ in range(3):
        start()
        t0 = _thread_time()
        for _ in range(calls):
            plain()
        t1 = _thread_time()
        for _ in range(calls):
            wrapped_()
        t2 = _thread_time()
        stop()
        best = min(best, ((t2 - t1) - (t1 - t0)) / calls)
    return max(best, 0.0)
