"""``refconv data convert SOURCE OUTPUT`` and ``refconv data synth OUTPUT``: the command line of the
store writers :func:`refconv.datastore.convert.convert` and :func:`refconv.datastore.convert.synthesize`
(what they write, and how: :mod:`refconv.datastore.convert`)."""

import numpy
from mpi4py import MPI

from refconv import train_config
from refconv.datastore import convert as writers, open_store

HELP = "data stores: convert an .npz or a folder of images to HDF5 or .npy shards, or write synthetic samples"
DESCRIPTION = writers.__doc__.split("\n\n")[0]


# the command protocol of refconv.cli
def add_arguments(parser):
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    p = sub.add_parser("convert", help="an .npz or a folder of images to HDF5 or .npy shards",
                       description="An .npz (images or volumes), a folder of images or a store to HDF5 or .npy "
                                   "shards.")
    p.add_argument("source", help="an .npz, a folder of images (one subfolder per class), or a store")
    p.add_argument("output", help="FILE.h5 (HDF5) or a new directory (.npy shards)")
    p.add_argument("--image-size", type=int, default=None, help="resize every image to this height and width; "
                   "unset: images are kept at their size, which must then be the same for all")
    _store_options(p)
    p = sub.add_parser("synth", help="the samples of refconv train --synthetic into HDF5 or .npy shards",
                       description="Write the training samples that refconv train --model MODEL --synthetic makes "
                                   "with the same --synthetic-samples, --image-size and --seed (volumes and their "
                                   "targets for a model of volumes, else images and labels) to a store.")
    p.add_argument("output", help="FILE.h5 (HDF5) or a new directory (.npy shards)")
    train_config.add_option(p, "model")
    p.add_argument("--samples", "--synthetic-samples", dest="synthetic_samples", type=int,
                   default=train_config.BY_NAME["synthetic_samples"].default, metavar="N",
                   help="samples to write: refconv train's --synthetic-samples (default %(default)s)")
    train_config.add_option(p, "seed")
    train_config.add_option(p, "image_size", default=32, unset=None)  # a preset's unset --image-size in train
    _store_options(p)


def _store_options(p):
    p.add_argument("--chunk", type=int, default=64, help="HDF5 chunk size along each spatial dim at most (default 64)")
    p.add_argument("--shard-samples", type=int, default=4096, help="samples per .npy shard (default 4096)")
    p.add_argument("--group", type=int, default=256, help="samples read and written at a time (default 256)")


def run(args):
    if MPI.COMM_WORLD.Get_size() > 1:
        raise ValueError(f"refconv data {args.data_command} runs as one process; start it without mpiexec")
    options = {"chunk": args.chunk, "shard_samples": args.shard_samples, "group": args.group}
    if args.data_command == "synth":
        shape, dtype = writers.synthesize(args.output, model=args.model, samples=args.synthetic_samples,
                                          size=args.image_size, seed=args.seed, **options)
    else:
        shape, dtype = writers.convert(args.source, args.output, image_size=args.image_size, **options)
    labels = open_store(args.output).labels                         # what was written, read back
    print(f"wrote {args.output}: x {tuple(shape)} {numpy.dtype(dtype)}, y {labels.shape} {labels.dtype}", flush=True)
    return 0

