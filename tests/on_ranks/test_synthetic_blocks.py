"""``train --synthetic`` with each rank making only its block is the whole-batch path, bit for bit
(issue 22).

The whole-batch path is how ``--synthetic`` trained before: every rank made the global batch
(``x[idx]`` of :func:`refconv.datasets.synthetic_for`'s generator, an array) and extracted its
block; here it is the training loop of the serial replay (``train.serial_losses``) run on the
distributed model, with the same options.  ``train`` (each rank making its block, read ahead
or not) gives exactly its losses and test score at 1 to 8 ranks, for images and volumes, on
sample, spatial and channel splits (Stationary-W too, whose ranks make several pieces of the
channels).  And what a rank made in training is its block of each batch and nothing else.

On simulated ranks (refconv.simulated), at 1 to 6 and 8.
"""

import math

import numpy
from refconv import datasets, datastore, simulated
from refconv.model_spec import conv_layer
from refconv.testing.asserts import assert_all_ranks
from refconv.testing.ranks import on_ranks
from refconv.train import build_model, evaluate, load_dataset, load_model_spec, train
from refconv.train.serial_check import serial_losses
from refconv.train_config import TrainConfig

IMAGES = {"in_channels": 4, "layers": [conv_layer(4, 3, padding=1), {"type": "relu"}, {"type": "gap"},
                                       {"type": "linear", "out": 10}]}
VOLUMES = {"dims": 3, "loss": "mse", "in_channels": 4,
           "layers": [conv_layer(4, 3, padding=1), {"type": "relu"}, {"type": "gap"},
                      {"type": "linear", "out": datasets.VOLUME_TARGETS}]}

# Per world size: (model, grid options, blocks read ahead).
GRIDS = {
    1: [(IMAGES, {}, 1), (VOLUMES, {}, 0)],
    2: [(IMAGES, {"grid": {"sample": 2}}, 1), (IMAGES, {"grid": {"channel": 2}, "algorithm": "stationary-x"}, 0),
        (VOLUMES, {"grid": {"depth": 2}}, 1)],
    3: [(IMAGES, {"grid": {"height": 3}}, 0), (VOLUMES, {"grid": {"channel": 3}, "algorithm": "stationary-y"}, 1),
        (VOLUMES, {"grid": {"width": 3}}, 0)],
    4: [(IMAGES, {"grid": {"sample": 2, "width": 2}}, 1),
        (IMAGES, {"grid": {"channel": 4}, "algorithm": "stationary-w", "filter_groups": 2}, 0),
        (VOLUMES, {"grid": {"sample": 2, "height": 2}}, 1)],
    5: [(IMAGES, {"grid": {"height": 5}}, 0), (VOLUMES, {"grid": {"depth": 5}}, 1)],
    6: [(IMAGES, {"grid": {"sample": 2, "height": 3}}, 1),
        (VOLUMES, {"grid": {"channel": 2, "depth": 3}, "algorithm": "stationary-x"}, 0)],
    8: [(IMAGES, {"grid": {"sample": 2, "channel": 4}, "algorithm": "stationary-y"}, 1),
        (VOLUMES, {"grid": {"depth": 2, "height": 2, "width": 2}}, 0)],
}


def _config(model, defaults, prefetch):
    return TrainConfig(model=model, synthetic=True, synthetic_samples=12, image_size=6, batch_size=4, epochs=1,
                       dtype="float64", lr=0.01, backend="numpy", progress=False, seed=2, prefetch=prefetch,
                       **defaults)


def _whole_batch(comm, cfg):
    """The losses and test score of the whole-batch path (see the module), on the same model."""
    spec, dtype = load_model_spec(cfg.model), numpy.dtype(cfg.dtype)
    x, y, k = datasets.synthetic_for(spec, cfg.synthetic_samples, cfg.image_size, seed=cfg.seed, dtype=dtype)
    xt, yt, _ = datasets.synthetic_for(spec, cfg.synthetic_samples // 4, cfg.image_size, seed=cfg.seed, dtype=dtype, part=1)
    model = build_model(cfg, comm=comm, in_channels=x.shape[1], num_classes=k)
    model.set_overlap(cfg.overlap)
    model.set_buckets(cfg.bucket_kib * 1024)
    with model:
        return serial_losses(cfg, model, 3, x, y), evaluate(model, xt, yt, cfg.batch_size)


@on_ranks(*GRIDS)
def test_train_synthetic_made_per_rank_is_the_whole_batch_path_bit_for_bit(comm):
    for model, defaults, prefetch in GRIDS[comm.size]:
        cfg = _config(model, defaults, prefetch)
        result = train(cfg, comm=comm, log=lambda *a: None)
        score = result.get("accuracy", result.get("mse"))
        old = _whole_batch(comm, cfg)
        assert_all_ranks(comm, (result["losses"], score) == old and len(old[0]) == 3,
                         f"{defaults}, prefetch {prefetch}: {(result['losses'], score)} != whole batch {old}")


@on_ranks(*(size for size in GRIDS if size > 1))
def test_a_rank_makes_only_its_block_of_each_batch(comm):
    """An epoch (3 batches of 4) on the model's own input layout, which splits the batch at
    every grid here: each rank's generator made its block of each batch (its samples, once per
    box of its pieces; its cells), and that is less than the batch."""
    for model, defaults, prefetch in GRIDS[comm.size]:
        cfg = _config(model, defaults, prefetch)
        x, y, _, _, k = load_dataset(cfg, numpy.dtype(cfg.dtype))
        net = build_model(cfg, comm=comm, in_channels=x.shape[1], num_classes=k)
        net.bind((cfg.batch_size,) + x.shape[1:])
        d, rank = net.input_distribution, net.in_grid.rank
        blocks = [datastore.local_block(x_b, d, rank)
                  for x_b, _ in datastore.batches(x, y, cfg.batch_size, seed=cfg.seed, drop_last=True,
                                                  distribution=d, rank=rank, depth=prefetch)]
        boxes = math.prod(len(d.pieces(rank, dim)) for dim in range(1, x.ndim))
        block, batch = math.prod(d.local_shape(rank)), cfg.batch_size * math.prod(x.shape[1:])
        expected = {"samples": 3 * d.local_shape(rank)[0] * boxes, "cells": 3 * block}
        made = {key: x.store.made[key] for key in expected}
        net.close()
        ok = made == expected and [b.size for b in blocks] == [block] * 3 and block < batch
        assert_all_ranks(comm, ok, f"{defaults}: rank {rank} made {made} of blocks of {block} cells, expected "
                                   f"{expected} (a batch: {batch} cells)")
