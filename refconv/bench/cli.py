"""``refconv bench {kernels,collectives,layer,step,data}``: one command, the same flags, JSON lines out;
``refconv bench overlap``: overlapped against blocking communication (its own flags, a table);
``refconv bench rank_step``: a simulated rank's CPU per training step by category (a table).

    refconv bench kernels --quick
    mpiexec -n 2 refconv bench collectives --mb 16
    mpiexec -n 4 refconv bench layer --shape wide --batch 16 --out results.jsonl
    mpiexec -n 4 refconv bench step --model digits-cnn --grid channel=4 --algorithm stationary-w
    mpiexec -n 4 refconv bench data --grid sample=2,height=2 --batch 32 --image-size 256

Every rank binds to its device first (``refconv.device.bind``, as ``refconv
info``); each configuration becomes one line appended to ``--out`` holding
``refconv info``'s record, the configuration, per-pass times (min, median, max)
and bytes per kind of collective (``refconv.bench.schema``).  Bad input (a grid
that does not match the ranks, more ranks per node than GPUs, a flag a
subcommand does not take) prints one line and exits with status 2 on every rank.
"""

import sys

from mpi4py import MPI

from refconv import checks, cli, device, threads
from refconv.bench import collectives, common, data, kernels, layer, overlap, rank_step, step
from refconv.commands import info

NAME = "bench"
SUBCOMMANDS = {
    "kernels": (kernels, "the convolution kernels of one process vs cuDNN (GPU) or torch (CPU)"),
    "collectives": (collectives, "allreduce, reduce-scatter or allgather (--op): refconv.collectives vs raw mpi4py"),
    "layer": (layer, "one DistConv2d forward + backward per strategy: time and bytes per collective"),
    "step": (step, "one training step of a model preset: time and bytes per collective"),
    "data": (data, "each rank's block of a store: bytes read per step, read throughput, peak memory"),
}
# Side-by-side comparisons with flags of their own (no --out, no common flags): run(args) does it all.
STANDALONE = {
    "overlap": (overlap, "overlapped against blocking communication: progress, step (--timeline), halo, buckets"),
    "rank_step": (rank_step, "where a simulated rank's CPU goes in one shapes-only training step, beside the budget"),
}


HELP = "benchmarks: kernels, collectives, layer, step, data (JSON lines with --out); overlap, rank_step"
DESCRIPTION = __doc__.split("\n\n")[0]


def add_arguments(p):
    sub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (module, text) in SUBCOMMANDS.items():
        s = sub.add_parser(name, help=text, description=module.__doc__.split("\n\n")[0])
        common.add_arguments(s)
        if hasattr(module, "add_arguments"):
            module.add_arguments(s)
    for name, (module, text) in STANDALONE.items():
        module.add_arguments(sub.add_parser(name, help=text, description=module.__doc__.split("\n\n")[0]))


def run(args):
    """Run the chosen benchmark on every rank; rank 0 prints and appends to ``--out``.
    Bad input raises ValueError on every rank alike (``refconv.cli.main`` reports it)."""
    if args.bench in STANDALONE:
        return STANDALONE[args.bench][0].run(args)
    comm = MPI.COMM_WORLD
    module, _ = SUBCOMMANDS[args.bench]
    if args.out:
        checks.output_file(args.out, "--out")  # every rank, before the run: not rank 0 alone at its end
    threads.configure(comm, args.threads)  # BLAS threads: cores / ranks per node unless the user chose
    binding = device.bind(comm, args.backend, oversubscribe=args.oversubscribe_gpus)
    env = info.collect(comm, binding=binding)
    lines = module.run(args, comm, env)
    if comm.Get_rank() == 0 and args.out:
        common.append_lines(args.out, lines)
        print(f"appended {len(lines)} line(s) to {args.out}", flush=True)
    return 0


def main(argv=None):
    """``python -m refconv.bench ...``: the same as ``refconv bench ...``."""
    return cli.main([NAME, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
