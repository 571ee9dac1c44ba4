"""The ``refconv`` command line: ``refconv train ...`` (run it under mpiexec)."""

import argparse
import sys

from refconv import __version__

GRID_AXES = ("sample", "channel", "height", "width")


def parse_grid(text):
    """``"sample=2,channel=2"`` -> ``{"sample": 2, "channel": 2}`` (argparse type)."""
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in GRID_AXES:
            raise argparse.ArgumentTypeError(
                f"--grid: expected axis=size pairs with axes {GRID_AXES}, e.g. sample=2,channel=2; got {part!r}")
        try:
            out[key] = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--grid: {key} must be an int, got {value!r}") from None
        if out[key] < 1:
            raise argparse.ArgumentTypeError(f"--grid: {key} must be >= 1, got {out[key]}")
    return out


def build_parser():
    parser = argparse.ArgumentParser(
        prog="refconv",
        description="Channel/filter, sample and spatial parallel CNN training.",
        epilog="Run distributed commands under MPI, e.g. "
               "mpiexec -n 4 refconv train --grid sample=2,channel=2 --algorithm stationary-x",
    )
    parser.add_argument("--version", action="version", version=f"refconv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    t = sub.add_parser(
        "train", help="train a CNN with sample, channel/filter and spatial parallelism",
        description="Train a CNN on the process grid of every rank of MPI.COMM_WORLD. Rank 0 prints "
                    "a progress bar (stderr), the loss and test accuracy per epoch, and a summary of the "
                    "time and bytes communicated per step by kind of collective.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # ArgumentDefaultsHelpFormatter appends "(default: ...)" to every option with help text.
    g = t.add_argument_group("parallel strategy (defaults for every layer; a model file may override per layer)")
    g.add_argument("--grid", type=parse_grid, default=None,
                   help="process grid, e.g. sample=2,channel=2 or sample=2,height=2; the product must be "
                        "the number of ranks; unset: sample=<ranks>")
    g.add_argument("--algorithm", choices=("stationary-x", "stationary-y", "stationary-w"), default=None,
                   help="channel/filter algorithm of the convolutions when channel > 1; unset: stationary-x")
    g.add_argument("--filter-groups", type=int, default=None,
                   help="p_f of stationary-w, a divisor of the channel size")
    m = t.add_argument_group("model and data")
    m.add_argument("--model", default="digits-cnn",
                   help="preset (digits-cnn, resnet50, resnet50-wide2, resnet50-wide4) or a JSON/YAML model file")
    m.add_argument("--data", default=None,
                   help="an .npz with x (N,C,H,W) and y (N,); 20%% is held out for testing; unset: the bundled digits")
    m.add_argument("--synthetic", action="store_true", help="train on generated images instead (scaling runs)")
    m.add_argument("--synthetic-samples", type=int, default=1024, help="training images with --synthetic")
    m.add_argument("--image-size", type=int, default=32, help="height and width of --synthetic images")
    o = t.add_argument_group("optimisation")
    o.add_argument("--epochs", type=int, default=4, help="passes over the training set")
    o.add_argument("--batch-size", type=int, default=32, help="global batch size (split over the sample axis)")
    o.add_argument("--lr", type=float, default=0.1, help="peak SGD learning rate")
    o.add_argument("--lr-schedule", choices=("cosine", "constant"), default="cosine",
                   help="cosine: decay to 0 over the run")
    o.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    o.add_argument("--weight-decay", type=float, default=1e-4, help="L2 penalty added to each gradient")
    o.add_argument("--seed", type=int, default=0, help="parameters and data order: same seed, same run")
    o.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    r = t.add_argument_group("run")
    r.add_argument("--backend", choices=("auto", "numpy", "cuda"), default="auto",
                   help="numpy: the CPU path; cuda: the Numba kernels; auto: cuda when a GPU answers")
    r.add_argument("--dtype", choices=("float32", "float64"), default="float32", help="parameter and activation dtype")
    r.add_argument("--checkpoint-dir", default=None, help="save a checkpoint here after every epoch")
    r.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS",
                   help="also save every STEPS steps (0: only after each epoch)")
    r.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir "
                                                          "(it may come from another grid or algorithm)")
    r.add_argument("--check-serial", type=int, default=0, metavar="K",
                   help="replay the first K steps on one rank (rank 0) and assert the losses agree")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def train_command(args):
    from refconv.failure import install_abort_on_exception
    from refconv.train import TrainConfig, format_summary, train

    install_abort_on_exception()  # an exception on one rank ends every rank
    cfg = TrainConfig(model=args.model, grid=args.grid, algorithm=args.algorithm, filter_groups=args.filter_groups,
                      data=args.data, synthetic=args.synthetic, synthetic_samples=args.synthetic_samples,
                      image_size=args.image_size, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                      lr_schedule=args.lr_schedule,
                      momentum=args.momentum, weight_decay=args.weight_decay, seed=args.seed, backend=args.backend,
                      dtype=args.dtype, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                      resume=args.resume,
                      check_serial=args.check_serial, max_steps=args.max_steps, progress=not args.no_progress)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    try:
        result = train(cfg)
    except ValueError as exc:  # bad input (grid, model, data, checkpoint): the message says what to fix
        prefix = f"[rank {comm.Get_rank()}] " if comm.Get_size() > 1 else ""
        print(f"{prefix}refconv train: error: {exc}", file=sys.stderr, flush=True)
        if comm.Get_size() > 1:
            comm.Abort(2)  # the other ranks may be waiting in a collective
        return 2
    if comm.Get_rank() == 0:
        print(format_summary(result, cfg), flush=True)
    return 0


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "train":
        return train_command(args)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
