"""The zoo's correct twins under real MPI: ``mpiexec -n K python tests/mpi_zoo/twins_under_mpiexec.py``.

Each twin of a program that runs at K ranks runs on ``MPI.COMM_WORLD``, once for each guilty rank,
with a Barrier between runs.  A twin that raises (its own check included) is reported by every rank
that saw it, and the job ends with status 1; a twin that hangs under MPI hangs the job (the caller's
timeout ends it).  So a twin the simulated world rejects can be told apart from a twin that is wrong.
One-sided communication, persistent requests, Probe, groups and derived datatypes run here too.
test_zoo.py's extended test launches it at 2, 3, 4 and 8 ranks.
"""

import sys

from mpi4py import MPI

import zoo_programs  # noqa: F401  (registers every program)
from zoo_registry import PROGRAMS


def main():
    comm = MPI.COMM_WORLD
    failed = runs = 0
    for program in (p for p in PROGRAMS if comm.size in p.ranks):
        for guilty in program.guilty_ranks(comm.size):
            comm.Barrier()
            try:
                program.correct(comm, guilty)
            except Exception as err:   # noqa: BLE001  (a twin that raises is the finding)
                failed += 1
                print(f"rank {comm.rank}: {program.name} (guilty {guilty}): {type(err).__name__}: {err}", flush=True)
            runs += 1
    failed = comm.allreduce(failed)
    if comm.rank == 0:
        print(f"twins under mpiexec -n {comm.size} ({MPI.Get_library_version().splitlines()[0].strip()}): "
              f"{runs} runs, {failed} failed on some rank", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
