"""More of MPI's collectives on a simulated communicator: the calls refconv does not make but MPI
programs do (``Reduce``, ``Gather``, ``Scatter``, ``Alltoall``, ``Ibarrier``, ``Ibcast``).

:class:`Collectives` is a part of :class:`refconv.simulated.comm.Comm`; each call checks its
parameters as MPI does (:mod:`refconv.simulated.params`) and runs on the engine's existing moves:
a Gather is a Gatherv of equal blocks, an Alltoall an Alltoallv of equal blocks.

==============================  =====================================================================
call                            blocks
==============================  =====================================================================
``Reduce``                      the reduction of every rank's send buffer in rank order, on ``root``
``Gather``, ``Scatter``         block r of root's buffer from/to rank r: ``recvcount``/``sendcount``
                                items (the buffer's size over the ranks, or ``[buf, count, type]``)
``Alltoall``                    block r of the send buffer to rank r, equal blocks
``Ibarrier``, ``Ibcast``        as ``Barrier`` and ``Bcast``, completed by a Wait; Ibcast's buffer
                                holds poison on the ranks that receive until then
==============================  =====================================================================
"""

from mpi4py import MPI

from refconv.simulated import buffers, params
from refconv.simulated.params import op_name
from refconv.simulated.world import InvalidParameter


class Collectives:
    """The collectives of the module's table, mixed into :class:`refconv.simulated.comm.Comm`."""

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
        self._live("Reduce")
        root = params.rank(root, self, "Reduce", "root")
        recv = region = None
        if self._rank == root:
            array, region = buffers.whole(recvbuf, self._what("Reduce", " receive"))
            recv = buffers.typed(array, region, self._what("Reduce", " receive"))
        if sendbuf is MPI.IN_PLACE:
            if self._rank != root:
                raise InvalidParameter(f"{self._what('Reduce')}: MPI.IN_PLACE is the root's send buffer only "
                                       f"(root {root})")
            send, send_region = recv, region
        else:
            array, send_region = buffers.whole(sendbuf, self._what("Reduce", " send"))
            send = buffers.typed(array, send_region, self._what("Reduce", " send"))
        if region is not None and (region.items != send_region.items or region.basic != send_region.basic):
            raise InvalidParameter(f"{self._what('Reduce')}: the send buffer ({buffers.signature(send_region)}) and "
                                   f"the receive buffer ({buffers.signature(region)}) must hold as many items of one type")
        reduce = params.reduction(op, send.dtype, self._what("Reduce"))
        self._wait(self._collective("Reduce", (root, buffers.signature(send_region), op_name(op)), send=send,
                                    out=recv, reduce=reduce, root=root))

    def Gather(self, sendbuf, recvbuf, root=0):
        self._live("Gather")
        root = params.rank(root, self, "Gather", "root")
        send, send_region = buffers.whole(sendbuf, self._what("Gather", " send"))
        recv, recv_blocks = self._equal_blocks(recvbuf, "Gather", " receive") if self._rank == root else (None, None)
        self._wait(self._collective("Gather", (root,), send=send, recv=recv, send_region=send_region,
                                    recv_blocks=recv_blocks, root=root,
                                    kinds=buffers.kinds(send_region, *(recv_blocks or ()))))

    def Scatter(self, sendbuf, recvbuf, root=0):
        self._live("Scatter")
        root = params.rank(root, self, "Scatter", "root")
        recv, recv_region = buffers.whole(recvbuf, self._what("Scatter", " receive"))
        send, send_blocks = self._equal_blocks(sendbuf, "Scatter", " send") if self._rank == root else (None, None)
        self._wait(self._collective("Scatter", (root,), send=send, recv=recv, send_blocks=send_blocks,
                                    recv_region=recv_region, root=root,
                                    kinds=buffers.kinds(recv_region, *(send_blocks or ()))))

    def Alltoall(self, sendbuf, recvbuf):
        self._live("Alltoall")
        send, send_blocks = self._equal_blocks(sendbuf, "Alltoall", " send")
        recv, recv_blocks = self._equal_blocks(recvbuf, "Alltoall", " receive")
        self._wait(self._collective("Alltoall", (), send=send, recv=recv, send_blocks=send_blocks,
                                    recv_blocks=recv_blocks, kinds=buffers.kinds(*send_blocks, *recv_blocks)))

    def Ibarrier(self):
        self._live("Ibarrier")
        return self._collective("Ibarrier", (), poison=True, call="Ibarrier")

    def Ibcast(self, buf, root=0):
        self._live("Ibcast")
        root = params.rank(root, self, "Ibcast", "root")
        array, region = buffers.whole(buf, self._what("Ibcast"))
        into = None if self._rank == root else array       # the ranks that receive: poison until the Wait
        return self._collective("Ibcast", (root, buffers.signature(region)), buf=array, region=region, root=root,
                                recv=into, poison=True, call="Ibcast")

    def _equal_blocks(self, buf, call, part):
        """One region per rank of ``buf`` in equal blocks: ``[buf, count, type]`` (count items each) or the
        whole buffer (its items over the ranks, which must divide them)."""
        what = self._what(call, part)
        size = self.Get_size()
        array, whole = buffers.whole(buf, what)
        kind = whole.layout
        if isinstance(buf, (list, tuple)) and len(buf) == 3:
            count = int(buf[1])
            step = count * kind.extent
            if size * step > array.nbytes:
                raise InvalidParameter(f"{what}: {size} blocks of {count} x {kind.name} need {size * step} bytes, "
                                       f"the buffer has {array.nbytes}")
        else:
            items = whole.nbytes // (kind.outer * kind.run) if kind.run else 0
            if items % size:
                raise InvalidParameter(f"{what}: the buffer's {items} items do not split into {size} equal blocks; "
                                       f"give [buf, count, datatype]")
            count, step = items // size, items // size * kind.extent
        return array, [buffers.Region(array, r * step, count, kind, f"{what} block {r}") for r in range(size)]

