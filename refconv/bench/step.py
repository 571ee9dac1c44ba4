"""``refconv bench step``: one training step of a model, the unit of ``refconv sweep``.

    mpiexec -n 4 refconv bench step --model digits-cnn --batch 64 --grid channel=4 --algorithm stationary-y

Builds the model exactly as ``refconv train`` does (``refconv.train.build_model``,
the same ``--grid``/``--algorithm``/``--filter-groups`` defaults for every
layer), feeds it synthetic images of the model's input size, and times
``refconv.train.step`` (forward, loss, backward, SGD update).  The results
line holds the traffic of one step per kind of collective, shuffles between
layers included (``alltoallv``).  On one rank with torch installed, the same
step in PyTorch is timed beside it (:func:`torch_comparison`).
"""

import importlib.util

import numpy

from refconv import threads, train, train_config
from refconv.bench import model_pair, timing
from refconv.bench.common import full_grid, grid_text, option, pause_for, record, reject, time_ranks, traffic
from refconv.optim import SGD

IMAGE_SIZE = {"digits-cnn": 16}  # the bundled digits' size; other presets get --image-size


def run(args, comm, env):
    """One results line: the step's times and traffic."""
    reject(args, ("shape",), "bench step times a whole model; give --model (bench layer takes --shape)")
    model_name = args.model or "digits-cnn"
    batch = option(args, "batch", 32)
    repeat = option(args, "repeat", 5)
    warmup = option(args, "warmup", 1, minimum=0)
    P = comm.Get_size()
    grid = full_grid(args.grid or {"sample": P}, P)
    size = option(args, "image_size", IMAGE_SIZE.get(model_name, 32))
    cfg = train_config.TrainConfig(model=model_name, grid=grid, algorithm=args.algorithm, filter_groups=args.filter_groups,
                            synthetic=True, synthetic_samples=batch, image_size=size, batch_size=batch,
                            backend=env["ranks"][comm.Get_rank()]["backend"], dtype=args.dtype, progress=False)
    x, y, _, _, classes = train.load_dataset(cfg, numpy.dtype(args.dtype))
    model = train.build_model(cfg, comm=comm, in_channels=x.shape[1], num_classes=classes)
    model.set_overlap(cfg.overlap)  # as refconv train runs it: communication behind compute
    optimizer = SGD(model, cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    x_b, y_b = numpy.asarray(x[0:batch]), numpy.asarray(y[0:batch])  # x_b: (batch, C, size, size), global
    times = time_ranks(comm, {"step": lambda: train.step(model, optimizer, x_b, y_b)}, repeat, warmup,
                       pause_for(env))["step"]
    moved = traffic(comm, lambda: train.step(model, optimizer, x_b, y_b), repeat,
                    moved_only=True)  # as refconv train reports it
    algorithm = args.algorithm or "stationary-x"
    label = f"{grid_text(grid)} {algorithm}"
    config = {"ranks": P, "grid": grid, "algorithm": algorithm, "filter_groups": args.filter_groups,
              "batch": batch, "model": model_name, "image_size": size, "dtype": args.dtype, "repeat": repeat,
              "warmup": warmup, "backend": env["ranks"][0]["backend"], "sweep": args.sweep}
    extra = {"images_per_s": batch / float(numpy.median(times)), "parameters": model.num_parameters()}
    model.close()
    versus = torch_comparison(model_name, batch, comm, repeat, warmup, pause_for(env))
    if versus:
        extra.update(versus)
    line = record("step", label, env, config, {"step": times}, moved, extra=extra)
    if comm.Get_rank() == 0:
        median = line["passes"]["step"]["median"]
        moved = sum(line["bytes"].values())
        print(f"{model_name}, batch {batch}, {args.dtype}, {P} ranks, {label}: {median * 1e3:.1f} ms per step "
              f"(min {line['passes']['step']['min'] * 1e3:.1f}, max {line['passes']['step']['max'] * 1e3:.1f}), "
              f"{batch / median:.0f} images/s, {moved:,} B recorded per step on the busiest rank")
        if versus:
            print(f"  vs torch (the same step in PyTorch, refconv.bench.torch_step; above 1: refconv is faster): "
                  f"{timing.Span(tuple(versus['vs_torch']['values'])).format(1, '', 2)}")
    return [line]


def torch_comparison(model_name, batch, comm, repeat, warmup, pause):
    """The same step in PyTorch, timed in alternating rounds with refconv's after both first
    losses agree (``refconv.bench.model_pair.step_contenders``): ``{"torch_step_s": span,
    "vs_torch": span of torch's time / refconv's}``.  None without torch, for a model
    torch_step does not build, or on more than one rank (``python -m refconv.bench.torch_step
    ddp`` compares sample parallelism against DistributedDataParallel)."""
    if comm.Get_size() > 1 or model_name not in model_pair.MODELS or importlib.util.find_spec("torch") is None:
        return None
    import torch  # optional: only to compare against

    threads.match(torch)  # the same threads as refconv's contender

    contenders, _ = model_pair.step_contenders(model_name, batch, comm, torch)  # checks the first losses agree
    spans = timing.compare(contenders, rounds=repeat, warmup=warmup, pause=pause)
    return {"torch_step_s": spans["torch"].as_dict(), "vs_torch": timing.ratio(spans, "torch", "refconv").as_dict()}


def add_arguments(p):
    """Flags of bench step only."""
    p.add_argument("--image-size", type=int, help="height and width of the synthetic images "
                                                  "(default: 16 for digits-cnn, else 32)")
