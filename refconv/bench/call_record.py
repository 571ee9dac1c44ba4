"""The call record's cost (refconv.collectives.flight): a training step with the record on and off.

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m refconv.bench.call_record [--model digits-cnn] [--grid channel=2]

The step is built as ``refconv bench step`` builds it (``train.build_model``, a synthetic batch,
``train.step``).  Two contenders in alternating rounds (``common.time_ranks``): ``record off`` (the
process's record set aside) and ``record on`` (the default ring of ``DEFAULT_CALLS``).  It prints the
ratio on / off of the median step, and, as an independent check, what one entry costs alone times
the entries a step makes, as a share of the step.  ``--grid channel=2`` makes the most calls a step.
"""

import argparse
import statistics
import time

import numpy
from mpi4py import MPI

from refconv import collectives, train, train_config
from refconv.bench.common import time_ranks
from refconv.collectives import flight, local
from refconv.optim import SGD


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m refconv.bench.call_record")
    train_config.add_option(parser, "model", default="digits-cnn")
    train_config.add_option(parser, "grid", default={"channel": 2})
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--pause", type=float, default=0.05, help="seconds between contenders")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    state = local.process_state()
    record = state.flight
    if record is None:
        raise SystemExit("REFCONV_RECORD_CALLS=0 turns the record off: unset it to compare on and off")
    cfg = train_config.TrainConfig(model=args.model, grid=args.grid, synthetic=True, synthetic_samples=args.batch,
                                   batch_size=args.batch, progress=False)
    x, y, _, _, classes = train.load_dataset(cfg, numpy.dtype("float32"))
    model = train.build_model(cfg, comm=comm, in_channels=x.shape[1], num_classes=classes)
    model.set_overlap(cfg.overlap)
    optimizer = SGD(model, cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    x_b, y_b = numpy.asarray(x[:args.batch]), numpy.asarray(y[:args.batch])   # x_b: (batch, C, H, W), global

    def step(flight):
        def run():
            state.flight = flight
            try:
                train.step(model, optimizer, x_b, y_b)
            finally:
                state.flight = record
        return run
    times = time_ranks(comm, {"record off": step(None), "record on": step(record)}, args.rounds, 1, args.pause)
    ratios = [on / off for on, off in zip(times["record on"], times["record off"])]
    before = record.count
    train.step(model, optimizer, x_b, y_b)
    entries = record.count - before                 # MPI calls a step makes on this rank
    model.close()
    n = 20000
    t = time.perf_counter()
    for _ in range(n):                              # one entry and its end, as guard makes them
        entry = record.begin("allreduce", "Allreduce", comm, 64)
        entry[flight.END] = time.perf_counter()
    per_entry = (time.perf_counter() - t) / n
    record.ring.clear()
    entries = max(collectives.allgather_object(comm, entries))
    per_entry = max(collectives.allgather_object(comm, per_entry))
    if comm.Get_rank() == 0:
        off = statistics.median(times["record off"])
        print(f"{args.model} step, grid {args.grid}, {comm.Get_size()} ranks, median of {args.rounds} rounds:")
        print(f"  record off {off * 1e3:.2f} ms, record on {statistics.median(times['record on']) * 1e3:.2f} ms")
        print(f"  step: record on / off = {statistics.median(ratios):.3f}x "
              f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")
        print(f"  one entry alone: {per_entry * 1e6:.2f} us, {entries} entries a step -> predicted "
              f"+{per_entry * entries / off:.2%} of a step")


if __name__ == "__main__":
    main()
