"""Bad parameters on every simulated call are MPI's errors, by name, never our crash (issue 42, item 6).

Each example makes one call of the simulated communicator with one bad value on rank 1 (rank 0
makes the good call) and asserts that the run raises rank 1's InvalidParameter, which names the
call, the parameter and the rank, within the run's timeout: no IndexError, TypeError,
AttributeError or KeyError from refconv's code, no hang, no silent success.  Hypothesis draws the
bad values (derandomized, as the suite's profile says).
"""

import numpy
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

from refconv import simulated
from refconv.simulated import FreedComm, InvalidParameter
from refconv.simulated.params import TAG_UB

SIZE = 2
BAD = 1                  # the rank that passes the bad value


def _buf(n=4):
    return numpy.zeros(n)


def _vbuf():
    return [numpy.zeros(4), ([2, 2], [0, 2])]


def _wbuf():
    return [numpy.zeros(4), ([16, 16], [0, 16]), [MPI.BYTE, MPI.BYTE]]


# call -> (body(comm, **args), the good arguments); the body makes the call on every rank
CALLS = {
    "Barrier": (lambda c: c.Barrier(), {}),
    "Allreduce": (lambda c, sendbuf, recvbuf, op: c.Allreduce(sendbuf, recvbuf, op=op),
                  dict(sendbuf=_buf, recvbuf=_buf, op=lambda: MPI.SUM)),
    "Iallreduce": (lambda c, sendbuf, recvbuf, op: c.Iallreduce(sendbuf, recvbuf, op=op).Wait(),
                   dict(sendbuf=_buf, recvbuf=_buf, op=lambda: MPI.SUM)),
    "Bcast": (lambda c, buf, root: c.Bcast(buf, root=root), dict(buf=_buf, root=lambda: 0)),
    "bcast": (lambda c, obj, root: c.bcast(obj, root=root), dict(obj=lambda: 1, root=lambda: BAD)),  # obj: root's
    "allgather": (lambda c, obj: c.allgather(obj), dict(obj=lambda: 1)),
    "Alltoallv": (lambda c, sendbuf, recvbuf: c.Alltoallv(sendbuf, recvbuf), dict(sendbuf=_vbuf, recvbuf=_vbuf)),
    "Alltoallw": (lambda c, sendbuf, recvbuf: c.Alltoallw(sendbuf, recvbuf), dict(sendbuf=_wbuf, recvbuf=_wbuf)),
    "Ialltoallw": (lambda c, sendbuf, recvbuf: c.Ialltoallw(sendbuf, recvbuf).Wait(),
                   dict(sendbuf=_wbuf, recvbuf=_wbuf)),
    "Allgather": (lambda c, sendbuf, recvbuf: c.Allgather(sendbuf, recvbuf),
                  dict(sendbuf=lambda: _buf(2), recvbuf=_buf)),
    "Iallgather": (lambda c, sendbuf, recvbuf: c.Iallgather(sendbuf, recvbuf).Wait(),
                   dict(sendbuf=lambda: _buf(2), recvbuf=_buf)),
    "Scatterv": (lambda c, sendbuf, recvbuf, root: c.Scatterv(sendbuf, recvbuf, root=root),
                 dict(sendbuf=_vbuf, recvbuf=lambda: _buf(2), root=lambda: 1)),
    "Gatherv": (lambda c, sendbuf, recvbuf, root: c.Gatherv(sendbuf, recvbuf, root=root),
                dict(sendbuf=lambda: _buf(2), recvbuf=_vbuf, root=lambda: 1)),
    "Reduce": (lambda c, sendbuf, recvbuf, op, root: c.Reduce(sendbuf, recvbuf, op=op, root=root),
               dict(sendbuf=_buf, recvbuf=_buf, op=lambda: MPI.SUM, root=lambda: BAD)),   # recvbuf: root's
    "Gather": (lambda c, sendbuf, recvbuf, root: c.Gather(sendbuf, recvbuf, root=root),
               dict(sendbuf=lambda: _buf(2), recvbuf=_buf, root=lambda: BAD)),
    "Scatter": (lambda c, sendbuf, recvbuf, root: c.Scatter(sendbuf, recvbuf, root=root),
                dict(sendbuf=_buf, recvbuf=lambda: _buf(2), root=lambda: BAD)),
    "Alltoall": (lambda c, sendbuf, recvbuf: c.Alltoall(sendbuf, recvbuf), dict(sendbuf=_buf, recvbuf=_buf)),
    "Ibarrier": (lambda c: c.Ibarrier().Wait(), {}),
    "Ibcast": (lambda c, buf, root: c.Ibcast(buf, root=root).Wait(), dict(buf=_buf, root=lambda: 0)),
    "Split": (lambda c, color, key: c.Split(color, key), dict(color=lambda: 0, key=lambda: 0)),
    "Dup": (lambda c: c.Dup(), {}),
    "Get_attr": (lambda c, keyval: c.Get_attr(keyval), dict(keyval=lambda: MPI.TAG_UB)),
}
# point to point: rank 0 sends, rank 1 receives; the bad value goes to the call of BAD's side
P2P = {
    "Send": (lambda c, buf, dest, tag: c.Send(buf, dest, tag), dict(buf=_buf, dest=lambda: 0, tag=lambda: 0)),
    "Isend": (lambda c, buf, dest, tag: c.Isend(buf, dest, tag).Wait(), dict(buf=_buf, dest=lambda: 0, tag=lambda: 0)),
    "Issend": (lambda c, buf, dest, tag: c.Issend(buf, dest, tag).Wait(),
               dict(buf=_buf, dest=lambda: 0, tag=lambda: 0)),
    "Recv": (lambda c, buf, source, tag, status: c.Recv(buf, source, tag, status),
             dict(buf=_buf, source=lambda: 0, tag=lambda: 0, status=lambda: None)),
    "Irecv": (lambda c, buf, source, tag: c.Irecv(buf, source, tag).Wait(),
              dict(buf=_buf, source=lambda: 0, tag=lambda: 0)),
    "Wait": (lambda c, status: c.Irecv(_buf(), 0, 0).Wait(status), dict(status=lambda: None)),
    "Waitall": (lambda c, requests: simulated.comm.Request.Waitall(requests(c)),
                dict(requests=lambda: lambda c: [c.Irecv(_buf(), 0, 0)])),
    "Waitany": (lambda c, requests, status: simulated.comm.Request.Waitany(requests(c), status),
                dict(requests=lambda: lambda c: [c.Irecv(_buf(), 0, 0)], status=lambda: None)),
}

INTS = st.integers(min_value=-(2 ** 40), max_value=2 ** 40)
NOT_INT = st.sampled_from([None, "1", 1.5, [0], numpy.float64(1.0)])
NON_CONTIGUOUS = numpy.zeros((4, 2))[:, 0]
BAD_BUFFERS = st.sampled_from([
    None, [1.0, 2.0], "abcd", 3, NON_CONTIGUOUS, numpy.zeros(4)[::2],
    [numpy.zeros(4), -1, MPI.DOUBLE], [numpy.zeros(4), 100, MPI.DOUBLE], [numpy.zeros(4), "x"],
    [numpy.zeros(4), 1, "float"], [numpy.zeros(4), 1, MPI.DATATYPE_NULL], (numpy.zeros(4),),
    [numpy.zeros(4), 2, MPI.DOUBLE, 0, 1],
])
BAD_VBUFFERS = st.sampled_from([
    None, numpy.zeros(4), [numpy.zeros(4), ([2], [0])], [numpy.zeros(4), ([2, 2], [0])],
    [numpy.zeros(4), ([-1, 2], [0, 2])], [numpy.zeros(4), ([2, 2], [0, 3])], [numpy.zeros(4), ([2, "2"], [0, 2])],
    [numpy.zeros(4), 5], [numpy.zeros(4), ([2, 2], [0, 2]), [MPI.DOUBLE]],
])
BAD_WBUFFERS = st.sampled_from([
    None, numpy.zeros(4), [numpy.zeros(4), ([16, 16], [0, 16])], [numpy.zeros(4), ([16, 16], [0, 16]), None],
    [numpy.zeros(4), ([16, 16], [0, 16]), [MPI.BYTE]], [numpy.zeros(4), ([16, 17], [0, 16]), [MPI.BYTE, MPI.BYTE]],
    [numpy.zeros(4), ([16, 16], [0, 16]), [MPI.BYTE, "b"]],
])


def _ranks(special=()):
    """Ints that are no rank of a SIZE-rank communicator and none of ``special``."""
    return st.one_of(NOT_INT, INTS.filter(lambda v: not 0 <= v < SIZE and v not in special))


BAD_VALUES = {
    "root": _ranks(),
    "dest": _ranks((MPI.PROC_NULL,)),
    "source": _ranks((MPI.PROC_NULL, MPI.ANY_SOURCE)),
    "tag": st.one_of(NOT_INT, INTS.filter(lambda v: v < 0 and v != MPI.ANY_TAG), st.integers(TAG_UB + 1, 2 ** 40)),
    "color": st.one_of(NOT_INT, INTS.filter(lambda v: v < 0 and v != MPI.UNDEFINED)),
    "key": NOT_INT,
    "op": st.sampled_from(["sum", None, 1, MPI.REPLACE, MPI.NO_OP, MPI.OP_NULL, MPI.BAND, MPI.LOR, sum]),
    "buf": BAD_BUFFERS,
    "sendbuf": BAD_BUFFERS,
    "recvbuf": BAD_BUFFERS,
    "obj": st.sampled_from([lambda: 0]),                  # cannot be pickled
    "status": st.sampled_from([1, "status", [MPI.Status()]]),
    "requests": st.sampled_from([lambda c: 3, lambda c: [None], lambda c: ["request"]]),
    "keyval": st.sampled_from([None, "TAG_UB"]),
}
VECTOR_CALLS = {"Alltoallv": BAD_VBUFFERS, "Scatterv": BAD_VBUFFERS, "Gatherv": BAD_VBUFFERS,
                "Alltoallw": BAD_WBUFFERS, "Ialltoallw": BAD_WBUFFERS}
SEND_SIDE = {"Send", "Isend", "Issend"}


def _cases():
    cases = []
    for name, (_, good) in {**CALLS, **P2P}.items():
        for param in good:
            if name in VECTOR_CALLS and param in ("sendbuf", "recvbuf") and \
                    not (name in ("Scatterv", "Gatherv") and param == ("recvbuf" if name == "Scatterv" else "sendbuf")):
                cases.append((name, param, VECTOR_CALLS[name]))
            elif name in ("Allgather", "Iallgather") and param == "recvbuf":
                cases.append((name, param, st.sampled_from([None, "x", NON_CONTIGUOUS, [numpy.zeros(4), -1, MPI.BYTE],
                                                            [numpy.zeros(4), 2, None]])))
            else:
                cases.append((name, param, BAD_VALUES[param]))
    return cases


CASES = _cases()


def _program(name, param, value):
    """The body of the run: rank BAD passes ``value`` for ``param``, the other rank the good arguments."""
    body, good = {**CALLS, **P2P}[name]

    def program(comm):
        args = {k: make() for k, make in good.items()}
        if comm.rank == BAD:
            args[param] = value
        if name not in P2P:
            return body(comm, **args)
        if comm.rank == BAD:                      # the call under test, on rank 1
            return body(comm, **args)
        if name in SEND_SIDE:                     # rank 0: the call's partner
            return comm.Recv(_buf(), 1, 0)
        return comm.Send(_buf(), 1, 0)
    return program


@pytest.mark.parametrize("name, param, values", CASES, ids=[f"{n}-{p}" for n, p, _ in CASES])
@settings(max_examples=8)
@given(data=st.data())
def test_a_bad_parameter_is_an_invalid_parameter_naming_call_parameter_and_rank(name, param, values, data):
    value = data.draw(values, label=param)
    with pytest.raises(simulated.SimulatedError) as caught:
        simulated.run(_program(name, param, value), SIZE, stepped=True, timeout=10)
    error = caught.value
    assert isinstance(error, (InvalidParameter, simulated.Unsupported)), (type(error), error)
    first = str(error).splitlines()[0]
    assert f"rank {BAD}" in first, first
    assert "object at 0x" not in str(error), first


@pytest.mark.parametrize("name", sorted(set(CALLS) - {"Get_attr"} | {"Send", "Irecv"}))
def test_every_call_on_a_freed_communicator_is_a_freed_comm(name):
    body, good = {**CALLS, **P2P}[name]

    def program(comm):
        dup = comm.Dup()
        dup.Free()
        return body(dup, **{k: make() for k, make in good.items()})
    with pytest.raises(FreedComm, match=r"on rank 0: communicator 'world/split 0' was freed"):
        simulated.run(program, SIZE, timeout=10)


def test_the_sweep_reaches_every_call_and_parameter():
    """A call or a parameter added to the tables without a bad-value strategy would be swept by nothing."""
    assert {n for n, _, _ in CASES} == (set(CALLS) - {"Barrier", "Ibarrier", "Dup"}) | set(P2P)
    assert all(values is not None for _, _, values in CASES)
