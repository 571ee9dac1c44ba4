"""One model in refconv and in PyTorch, with the same parameters: the step contenders of
``refconv.bench.torch_step step`` and ``ddp`` (and the models ``refconv.bench.step`` and
``refconv.bench.overlap`` time).

torch is never imported here: the callers pass the module (``torch_step.import_torch``), so that
torch stays an optional contender imported in one place.
"""

import math
import socket

import numpy

from refconv import Model, collectives, train
from refconv.optim import SGD

# The wide 4-conv CNN of issue 10 (CIFAR-sized input).
WIDE_CNN = {"name": "wide-cnn", "in_channels": 3, "layers": [
    {"type": "conv", "out": 128, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
    {"type": "conv", "out": 128, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
    {"type": "maxpool", "kernel": 2},
    {"type": "conv", "out": 256, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
    {"type": "conv", "out": 256, "kernel": 3, "padding": 1}, {"type": "batchnorm"}, {"type": "relu"},
    {"type": "gap"}, {"type": "linear", "out": 10}]}
# model: (spec, image size, default batch)
MODELS = {"digits-cnn": ("digits-cnn", 16, 64), "resnet50": ("resnet50", 32, 16), "wide-cnn": (WIDE_CNN, 32, 32)}
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4  # refconv train's defaults


def torch_model(spec, torch):
    """The ``torch.nn.Module`` of a refconv model spec (conv, batchnorm, relu, pools, gap, linear,
    residual), parameters in the order of ``refconv.Model.named_parameters``."""
    nn = torch.nn

    class Residual(nn.Module):
        def __init__(self, body, shortcut):
            super().__init__()
            self.body, self.shortcut = body, shortcut

        def forward(self, x):
            return self.body(x) + self.shortcut(x)

    def build(layers, ch):
        mods = []
        for d in layers:
            kind = d["type"]
            if kind == "conv":
                mods.append(nn.Conv2d(ch, d["out"], d["kernel"], stride=d.get("stride", 1), padding=d.get("padding", 0),
                                      dilation=d.get("dilation", 1), groups=d.get("groups", 1), bias=d.get("bias", True)))
                ch = d["out"]
            elif kind == "batchnorm":
                mods.append(nn.BatchNorm2d(ch, eps=d.get("eps", 1e-5), momentum=d.get("momentum", 0.1)))
            elif kind == "relu":
                mods.append(nn.ReLU())
            elif kind in ("maxpool", "avgpool"):
                pool = nn.MaxPool2d if kind == "maxpool" else nn.AvgPool2d
                mods.append(pool(d["kernel"], d.get("stride"), d.get("padding", 0)))
            elif kind == "gap":
                mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
            elif kind == "linear":
                mods.append(nn.Linear(ch, d["out"], bias=d.get("bias", True)))
                ch = d["out"]
            elif kind == "residual":
                body, out = build(d["layers"], ch)
                shortcut = build(d["shortcut"], ch)[0] if d.get("shortcut") else nn.Identity()
                mods.append(Residual(body, shortcut))
                ch = out
            else:
                raise ValueError(f"spec: torch_model has no {kind!r} layer")
        return nn.Sequential(*mods), ch

    return build(spec["layers"], spec["in_channels"])[0]


def copy_parameters(model, net, torch):
    """Give the torch ``net`` the refconv ``model``'s parameters (replicated: sample-parallel grids)."""
    ours = [layer.parameters()[p] for _, layer, p in model.named_parameters()]
    theirs = list(net.parameters())
    if len(ours) != len(theirs):
        raise ValueError(f"torch model has {len(theirs)} parameters, refconv's {len(ours)}")
    with torch.no_grad():
        for a, t in zip(ours, theirs):
            a = numpy.asarray(a)
            if a.size != t.numel():
                raise ValueError(f"parameter sizes differ: refconv {a.shape}, torch {tuple(t.shape)}")
            t.copy_(torch.from_numpy(a.reshape(tuple(t.shape))))


def _data(batch, channels, size, classes, seed=0):
    rng = numpy.random.default_rng(seed)
    x = rng.standard_normal((batch, channels, size, size), dtype=numpy.float32)
    return x, rng.integers(0, classes, batch)


def refconv_step_of(model_name, batch, comm):
    """``(step, model, x, y)``: one training step of a preset on the numpy backend (SGD with
    momentum and weight decay), the model, and the global batch it trains on."""
    spec_name, size, _ = MODELS[model_name]
    classes = 10
    model = Model.from_spec(spec_name, comm=comm, backend="numpy", dtype=numpy.float32, seed=0,
                            **({"num_classes": classes} if isinstance(spec_name, str) else {}))
    x, y = _data(batch, model.spec["in_channels"], size, classes)
    optimizer = SGD(model, LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)

    def step():
        return train.step(model, optimizer, x, y)

    return step, model, x, y


def step_contenders(model_name, batch, comm, torch):
    """``({"refconv": step, "torch": step}, (refconv first loss, torch first loss))`` of one model;
    with ``comm.size > 1`` both are sample-parallel (refconv's grid, torch's DDP).  Raises
    AssertionError, before anything is timed, when the first losses differ by more than 1e-3."""
    refconv_step, model, x, y = refconv_step_of(model_name, batch, comm)
    spec = model.spec
    net = torch_model(spec, torch)
    copy_parameters(model, net, torch)
    P, rank = comm.Get_size(), comm.Get_rank()
    lo, hi = batch * rank // P, batch * (rank + 1) // P  # torch's samples on this rank
    with torch.no_grad():  # the first loss on the whole batch: what refconv's first step computes
        first_loss = float(torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y)))
    if P > 1:
        # refconv's batch norm reduces its statistics over the sample ranks; torch's SyncBatchNorm
        # needs a GPU, so DDP's batch norm normalises each rank's samples alone (less traffic).
        net = torch.nn.parallel.DistributedDataParallel(net)
    t_opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    xt, yt = torch.from_numpy(x[lo:hi]), torch.from_numpy(y[lo:hi])

    def torch_step():
        t_opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(xt), yt)
        loss.backward()
        t_opt.step()
        return loss

    first = (float(refconv_step()), first_loss)
    if not math.isclose(*first, rel_tol=1e-3):
        raise AssertionError(f"{model_name}: first-step losses differ: refconv {first[0]:.6f}, torch {first[1]:.6f}")
    if P == 1:
        return {"refconv": refconv_step, "torch": torch_step}, first

    def with_overlap(on):  # refconv train's default (on: the gradients' allreduces behind backward), and off
        def run():
            model.set_overlap(on)
            return refconv_step()
        return run
    return {"refconv": with_overlap(True), "refconv blocking": with_overlap(False), "torch": torch_step}, first


def init_torch_distributed(comm, torch):
    """gloo over loopback, rendezvous through MPI (rank 0's free port)."""
    port = None
    if comm.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = collectives.allgather_object(comm, port)[0]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=comm.Get_rank(), world_size=comm.Get_size())
