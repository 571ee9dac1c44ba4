"""Resident memory over a long training run: does anything grow per step?

    OMP_NUM_THREADS=1 mpiexec -n 2 python -m refconv.bench.longrun [--steps 2000] [--grid channel=2]

Trains ``--steps`` steps of a preset model on small synthetic images with the
training loop's own pieces (``refconv.train.step`` inside a
``collectives.stats.recording()`` region per step, and ``evaluate`` after every
epoch), under the training timeout.  Each rank reads its resident memory
(``VmRSS`` in ``/proc/self/status``) after ``--warmup`` steps and then every
tenth of the run; rank 0 prints one line per rank: the memory at the start and at
the end, the growth per 1,000 steps, and the samples between.
"""

import argparse

import numpy
from mpi4py import MPI

from refconv import collectives, datasets, train_config
from refconv.optim import SGD
from refconv.train import build_model, evaluate, load_dataset, step
from refconv.train_config import TrainConfig


def rss_mb():
    """This process's resident set size (VmRSS), in MB (1e6 B)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError("no VmRSS in /proc/self/status (Linux only)")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m refconv.bench.longrun", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="training steps after the warm-up")
    parser.add_argument("--warmup", type=int, default=100, help="steps before the first reading")
    train_config.add_option(parser, "model")
    train_config.add_option(parser, "grid", unset="sample=<ranks>")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--image-size", type=int, default=8)
    parser.add_argument("--samples", type=int, default=256, help="synthetic training images")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    cfg = TrainConfig(model=args.model, grid=args.grid, synthetic=True, synthetic_samples=args.samples,
                      image_size=args.image_size, batch_size=args.batch_size, backend="numpy",
                      lr_schedule="constant", progress=False)
    x, y, x_test, y_test, classes = load_dataset(cfg, numpy.dtype(cfg.dtype))
    model = build_model(cfg, comm=comm, in_channels=x.shape[1], num_classes=classes)
    optimizer = SGD(model, cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)

    readings = []                               # (step, MB) on this rank
    every = max(args.steps // 10, 1)
    done, epoch = 0, 0
    with collectives.timeout(cfg.timeout):
        while done < args.warmup + args.steps:
            for x_b, y_b in datasets.batches(x, y, cfg.batch_size, seed=cfg.seed, epoch=epoch, drop_last=True):
                with collectives.stats.recording() as region:
                    step(model, optimizer, x_b, y_b)
                region.summary(moved_only=True)     # as the training loop does
                done += 1
                after = done - args.warmup
                if after >= 0 and (after % every == 0 or after == args.steps):
                    readings.append((after, rss_mb()))
                if done == args.warmup + args.steps:
                    break
            evaluate(model, x_test, y_test, cfg.batch_size)
            epoch += 1
        everyone = collectives.allgather_object(comm, readings)
        kept = collectives.allgather_object(comm, len(collectives.stats.records))

    if comm.Get_rank() == 0:
        print(f"{args.model} on {comm.Get_size()} ranks (grid {args.grid or 'sample'}), batch {args.batch_size} "
              f"of {args.image_size}x{args.image_size} images: resident memory (VmRSS, MB) after "
              f"{args.warmup} warm-up steps and {args.steps} more")
        for r, rank_readings in enumerate(everyone):
            (_, start), (_, end) = rank_readings[0], rank_readings[-1]
            samples = " ".join(f"{mb:.1f}" for _, mb in rank_readings)
            print(f"  rank {r}: start {start:.1f}, end {end:.1f}, growth {(end - start) / args.steps * 1000:+.2f} "
                  f"MB per 1000 steps; every {every} steps: {samples}; stats.records holds {kept[r]}")


if __name__ == "__main__":
    main()
