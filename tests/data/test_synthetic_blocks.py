"""Synthetic samples made per rank (issue 22): a rank's block of a batch of ``--synthetic`` images
or volumes is what it would extract from the whole batch, bit for bit, and the rank makes only
that block: its samples, and of them its channels, planes, rows and columns (counted, not timed).

The multi-rank check (``train --synthetic`` gives the losses of the whole-batch path, bit for
bit, at 1 to 4 ranks on sample, spatial and channel splits, 2-D and 3-D) is
tests/on_ranks/test_synthetic_blocks.py.
"""

import itertools
import math

import numpy
import pytest

from refconv import datasets, datastore
from refconv.datastore import prefetch
from refconv.distribution import Distribution, Split
from refconv.train import load_dataset
from refconv.train_config import TrainConfig

IMAGES = (12, 4, 9, 10)          # (N, C, H, W)
VOLUMES = (12, 4, 6, 5, 7)       # (N, C, D, H, W)

# Layouts of a batch of 6: the grid shape and the dims, with the Stationary-W channel split whose
# rank holds several pieces of C.
LAYOUTS = [
    ((1, 1, 1, 1), ("sample", "channel", "height", "width")),
    ((3, 1, 1, 1), ("sample", None, None, None)),
    ((2, 1, 2, 2), ("sample", None, "height", "width")),
    ((1, 2, 3, 1), ("sample", "channel", "height", "width")),
    ((1, 4, 1, 1), (None, Split.stationary_w_channels(4, 2), None, None)),
    ((2, 1, 1, 1, 1), ("sample", None, None, None, None)),
    ((1, 1, 2, 1, 2), ("sample", None, "depth", "height", "width")),
    ((1, 2, 3, 1, 1), ("sample", "channel", "depth", "height", "width")),
    ((1, 4, 1, 1, 1), (None, Split.stationary_w_channels(4, 2), None, None, None)),
]


def _synthetic(ndim, dtype=numpy.float32):
    """Images (N, C, H, W), or volumes (N, C, D, H, W) of unequal sides (so that no two dims are mixed up)."""
    if ndim == 4:
        return datasets.synthetic(*IMAGES, num_classes=5, seed=3, dtype=dtype)[0]
    targets = numpy.random.default_rng(0).uniform(-1, 1, (VOLUMES[0], datasets.VOLUME_TARGETS))
    return datasets.SyntheticVolumes(targets, VOLUMES[1:], 3, dtype)


@pytest.mark.parametrize("grid_shape, dims", LAYOUTS)
def test_a_rank_makes_exactly_its_block_of_the_whole_batch(grid_shape, dims):
    """Per rank: the block made is the block extracted from the whole batch (``x[idx]``, as every
    rank made it before), and what was made is that block only: its samples (once per box of
    its pieces), its cells, and the noise of each sample up to the box's last element."""
    ndim = len(grid_shape)
    x = _synthetic(ndim, numpy.float64)
    idx = numpy.random.default_rng([1, 2]).permutation(len(x))[:6]
    whole = x[idx]                                                    # (6, C, ...): the whole-batch path
    lazy = datastore.StoreImages(x, range(len(x)), numpy.float64)
    d = Distribution(grid_shape, whole.shape, dims)
    for rank in range(math.prod(grid_shape)):
        before = dict(x.made)
        got = datastore.local_block(lazy[idx], d, rank)
        assert got.dtype == numpy.float64 and numpy.array_equal(got, d.extract(whole, rank)), rank
        pieces = [d.pieces(rank, dim) for dim in range(ndim)]
        boxes = list(itertools.product(*pieces[1:]))                # one box per piece of each dim
        n_loc = got.shape[0]
        made = {k: x.made[k] - before[k] for k in before}
        drawn = n_loc * sum(numpy.ravel_multi_index(tuple(b - 1 for _, b in box), x.shape[1:]) + 1 for box in boxes)
        assert made == {"samples": n_loc * len(boxes), "cells": got.size, "normals": drawn}, (rank, made)


def test_a_sample_split_draws_its_samples_only_and_a_spatial_split_stops_at_its_rows():
    """On 4 ranks of a batch of 8 images: a sample split makes 2 whole samples a rank (not 8); a
    height split makes 8 samples' rows a rank, drawing noise up to its last row only."""
    x = _synthetic(4)
    C, H, W = x.shape[1:]
    idx = numpy.arange(8)
    lazy = datastore.StoreImages(x, range(len(x)), numpy.float32)
    for grid_shape, dims, rows_drawn in (((4, 1, 1, 1), ("sample", None, None, None), lambda r: C * H),
                                         ((1, 1, 4, 1), (None, None, "height", None),
                                          lambda r: (C - 1) * H + numpy.array_split(numpy.arange(H), 4)[r][-1] + 1)):
        d = Distribution(grid_shape, (8, C, H, W), dims)
        for rank in range(4):
            before = dict(x.made)
            datastore.local_block(lazy[idx], d, rank)
            samples = 2 if grid_shape[0] == 4 else 8
            assert x.made["samples"] - before["samples"] == samples
            assert x.made["normals"] - before["normals"] == samples * rows_drawn(rank) * W


def _old_sample(kind, seed, i, labels, shape, num_classes=5):
    """Sample ``i`` as the whole-sample generator made it before per-rank blocks: a second copy of
    its formulas, kept on purpose as an independent oracle that the values did not change."""
    rng = numpy.random.default_rng([seed, 2])
    noise = numpy.random.default_rng([seed, 1, i]).standard_normal(shape)
    if kind == "images":
        C, H, W = shape
        f = rng.integers(1, 4, size=(2, num_classes, C))
        phase = rng.uniform(0, 1, size=(2, num_classes, C))
        rows = numpy.cos(2 * numpy.pi * (f[0, :, :, None] * numpy.arange(H) / H + phase[0, :, :, None]))
        cols = numpy.cos(2 * numpy.pi * (f[1, :, :, None] * numpy.arange(W) / W + phase[1, :, :, None]))
        amp = rng.choice([-2.0, 2.0], size=(num_classes, C))
        k = labels[i]
        return amp[k][:, None, None] * rows[k][:, :, None] * cols[k][:, None, :] + 1.0 * noise
    C, D, H, W = shape
    f, phase = rng.integers(1, 3, size=(3, C)), rng.uniform(0, 1, size=(3, C))
    axis = [numpy.cos(2 * numpy.pi * (f[a][:, None] * numpy.arange(n) / n + phase[a][:, None]))
            for a, n in enumerate((D, H, W))]
    smooth = axis[0][:, :, None, None] * axis[1][:, None, :, None] * axis[2][:, None, None, :]
    d, h, w = numpy.ogrid[:D, :H, :W]
    rough = rng.choice([-1.0, 1.0], size=C)[:, None, None, None] * numpy.where((d + h + w) % 2, -1.0, 1.0)[None]
    t = labels[i].astype(numpy.float64)
    return (1 + t[0] / 2) * noise + t[1] / 2 + t[2] * smooth + t[3] * rough


@pytest.mark.parametrize("kind", ["images", "volumes"])
def test_the_samples_are_the_values_they_were_bit_for_bit(kind):
    """Whole (``x[idx]``) and by box (a rank's block), the samples are those of the whole-sample
    generator they replaced, cast to the dtype alike."""
    x, y = (datasets.synthetic(5, 2, 6, 7, 5, seed=4) if kind == "images"
            else datasets.synthetic_volumes(5, 2, 5, seed=4))
    expected = numpy.stack([_old_sample(kind, 4, i, y, x.shape[1:]) for i in range(5)]).astype(numpy.float32)
    assert numpy.array_equal(numpy.asarray(x), expected)
    box = ((1, 2),) + tuple((1, n - 1) for n in x.shape[2:])
    out = numpy.empty((2,) + tuple(b - a for a, b in box), numpy.float32)
    x.read([3, 0], box, out)
    assert numpy.array_equal(out, expected[[3, 0]][(slice(None),) + tuple(slice(a, b) for a, b in box)])


@pytest.mark.parametrize("model", ["digits-cnn", "cosmoflow"])
def test_train_synthetic_trains_on_lazy_blocks_read_ahead(model):
    """``--synthetic`` data are lazy arrays over their generators, whose batches are read ahead
    (made in the prefetch thread) as a store's are, and hold what ``x[idx]`` makes."""
    cfg = TrainConfig(model=model, synthetic=True, synthetic_samples=8, image_size=4, seed=3)
    x, y, x_test, y_test, _ = load_dataset(cfg, numpy.dtype(numpy.float32))
    kind = datasets.SyntheticVolumes if model == "cosmoflow" else datasets.SyntheticImages
    assert isinstance(x, datastore.StoreImages) and type(x.store) is kind and len(x_test) == 2
    d = Distribution((2,) + (1,) * (x.ndim - 1), (4,) + x.shape[1:], ("sample",) + (None,) * (x.ndim - 1))
    it = datastore.batches(x, y, 4, distribution=d, rank=1, depth=1, seed=3, drop_last=True)
    assert isinstance(it, prefetch.Prefetcher)
    x_b, y_b = next(it)
    it.close()
    assert numpy.array_equal(datastore.local_block(x_b, d, 1), x.store[x_b.index[2:]])
