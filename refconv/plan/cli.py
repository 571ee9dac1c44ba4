"""``refconv plan``: the fastest per-layer strategy of a model on P ranks, predicted.

Usage::

    refconv plan --model resnet50 --ranks 64 --batch 2048 --image-size 224 \\
        --machine v100-edr --out plan.yaml

Prints the per-stage table and the totals against pure sample parallelism and
the best single strategy; ``--out`` writes a model file that ``refconv train
--model plan.yaml`` runs on ``P`` ranks, with the model's training recipe (its learning-rate rule,
schedule, momentum, weight decay and loss) and the image size planned for under ``train``
(:mod:`refconv.recipe`): the options the command leaves unset take them, as for the preset.  A model of volumes (``dims: 3``, e.g. ``--model
cosmoflow``) is planned on grids of five axes, ``--image-size`` its depth, height and
width (docs/planning.md, "Models of volumes").  Bad input (a missing or malformed
machine file, no feasible plan, a model it cannot bind) raises ValueError alike
on every rank, which :func:`refconv.cli.main` prints as one line, exiting with
status 2.  This command computes only (no collectives); under mpiexec every rank
plans and rank 0 prints.
"""

import json
import shlex
import sys
import warnings

import yaml
from mpi4py import MPI

from refconv import checks, datasets, recipe, train_config
from refconv.train import load_model_spec
from refconv.plan import report
from refconv.pricing import graph, machine as machine_mod, search


HELP = "plan every layer's grid and algorithm from a performance model"
DESCRIPTION = ("Search every factorisation of the ranks into sample x channel x height x width (sample x channel x "
               "depth x height x width for a model of volumes) per layer (and every channel algorithm and p_f), "
               "minimising the predicted step time with the shuffles between layers, under a memory limit. See "
               "docs/planning.md.")


def add_arguments(p):
    train_config.add_option(p, "model", default=None, unset=None, required=True)
    p.add_argument("--ranks", type=int, required=True, help="number of ranks P")
    p.add_argument("--batch", type=int, required=True, help="global batch size")
    p.add_argument("--image-size", type=int, default=32, help="height and width of the input images, or depth, "
                                                               "height and width of a model of volumes (default 32)")
    p.add_argument("--num-classes", type=int, default=None, help="classes of a preset's classifier "
                                                                  "(default: the preset's)")
    train_config.add_option(p, "machine")
    p.add_argument("--memory-per-rank", type=float, default=None, metavar="GiB", help="memory limit per rank")
    p.add_argument("--out", default=None, help="write the planned model file here (.yaml or .json)")
    return p


def _plan(args):
    for name in ("ranks", "batch", "image_size"):
        v = getattr(args, name)
        if v < 1:
            raise ValueError(f"--{name.replace('_', '-')}: expected a positive int, got {v}")
    search.check_ranks(args.ranks)  # before loading anything: a rank count it cannot search in minutes
    #                                 (over four axes; the planner checks a model of volumes' five again)
    if args.memory_per_rank is not None and args.memory_per_rank <= 0:
        raise ValueError(f"--memory-per-rank: expected a positive number of GiB, got {args.memory_per_rank}")
    if args.out and not args.out.endswith((".yaml", ".yml", ".json")):
        raise ValueError(f"--out: expected a .yaml or .json path, got {args.out!r}")
    if args.out:
        checks.output_file(args.out, "--out")  # before the search, not a traceback after it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        machine = machine_mod.load(args.machine)
    kwargs = {"num_classes": args.num_classes} if args.num_classes else {}
    spec = load_model_spec(args.model, **kwargs)  # a file that does not parse: "--model: ..." (as refconv train)
    dims = graph.dims_of(spec) if isinstance(spec, dict) else 2
    shape = (args.batch, spec.get("in_channels", 3) if isinstance(spec, dict) else 3) + (args.image_size,) * dims
    limit = args.memory_per_rank * 2**30 if args.memory_per_rank else None
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if _rank() == 0 else None
    planner, plan = search.plan_model(spec, shape, args.ranks, machine, limit, progress=say)
    sample = planner.sample_parallel()
    out = [str(w.message) for w in caught]
    out.append(f"model {spec.get('name', args.model)}, input {shape}, {args.ranks} ranks, machine "
               f"{machine.name} ({'measured ' + str(machine.measured) if machine.measured else 'not measured'})")
    out.append(report.table(plan))
    out.append(report.summary(plan, ("sample", sample) if sample else None, planner.best_uniform()))
    if args.out:
        planned = search.to_spec(spec, plan)
        preset = args.model if args.model in train_config.PRESETS else None
        planned["train"] = recipe.for_plan(spec, preset, args.image_size)  # refconv train's unset options
        planned["plan"] = prediction(plan, machine, args)     # refconv train's summary shows it beside its own
        text = json.dumps(planned, indent=1) if args.out.endswith(".json") else \
            yaml.safe_dump(planned, sort_keys=False, default_flow_style=None)   # whole, before the file is opened
        with open(args.out, "w") as f:
            f.write(text)
        out.append(f"wrote {args.out}: run it with  mpiexec -n {args.ranks} refconv train "
                   f"{shlex.join(train_arguments(args, shape))}")
    return "\n".join(out)


def prediction(plan, machine, args):
    """The planned file's ``plan:`` record: what was predicted of the step and its overlap, for
    the grid planned, which ``refconv train`` prints beside what it measures."""
    return {"machine": machine.name, "ranks": args.ranks, "batch": args.batch, "image_size": args.image_size,
            **{key: round(float(seconds) * 1e3, 6) for key, seconds in (
                ("step_ms", plan.seconds), ("overlapped_step_ms", plan.overlapped_seconds),
                ("grad_allreduce_ms", plan.grad_seconds), ("halo_ms", plan.comm("halo")),
                ("halo_hidden_ms", plan.halo_hidden_seconds))},
            "allreduce_hidden": float(plan.hidden)}


def train_arguments(args, shape):
    """The ``refconv train`` options that run the planned file on the input it was planned for:
    the bundled digits when ``shape`` is theirs, else synthetic images of its channels and size
    (at least one global batch of them)."""
    out = ["--model", args.out, "--batch-size", str(args.batch)]
    if tuple(shape[1:]) == datasets.DIGITS_SHAPE:
        return out
    out += ["--synthetic", "--image-size", str(args.image_size)]
    if args.batch > train_config.BY_NAME["synthetic_samples"].default:
        out += ["--synthetic-samples", str(args.batch)]
    return out


def run(args):
    """Plan and print on rank 0.  Bad input raises ValueError (a MachineError, BindError or
    NoFeasiblePlan), which ``refconv.cli.main`` turns into one line and status 2."""
    text = _plan(args)
    if _rank() == 0:
        print(text, flush=True)
    return 0


def _rank():
    return MPI.COMM_WORLD.Get_rank()
