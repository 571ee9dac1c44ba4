"""The plan as text: a per-stage table and the totals against the alternatives."""

from refconv.pricing.machine import KINDS
from refconv.pricing.search import strategy_label

_HEAD = [{"reduce_scatter": "red-scat", "alltoallv": "shuffle"}.get(k, k) for k in KINDS]  # column headings


def _ms(s):
    return f"{s * 1e3:.3f}"


def table(plan):
    """One line per stage (a conv, pool or gap with the batch norm/ReLU/linear after it) and
    per residual sum; times in ms on the busiest rank, the allreduce column includes the
    weight-gradient allreduce."""
    lines = [f"{'layer':16s} {'type':9s} {'strategy':22s} {'compute':>8s} "
             + " ".join(f"{h:>9s}" for h in _HEAD) + f" {'mem MiB':>8s}"]
    for r in plan.rows:
        c = r.cost
        comm = [c.comm.get(k, 0.0) + (c.grad if k == "allreduce" else 0.0) for k in KINDS]
        lines.append(f"{r.name:16s} {r.kind:9s} {strategy_label(c.grid, c.algorithm, c.filter_groups):22s} "
                     f"{_ms(c.fwd + c.bwd):>8s} " + " ".join(f"{_ms(t):>9s}" for t in comm)
                     + f" {c.memory / 2**20:8.1f}")
    comm = [plan.comm(k) + (plan.grad_seconds if k == "allreduce" else 0.0) for k in KINDS]
    if plan.input_grid is not None and plan.rows and plan.input_grid != plan.rows[0].cost.grid:
        # only a model that opens with a block: its input lies on a grid of its own (the plan's defaults.grid)
        lines.insert(1, f"{'input':16s} {'':9s} {strategy_label(plan.input_grid):22s}")
    lines.append(f"{'total':16s} {'':9s} {'':22s} {_ms(plan.compute_seconds):>8s} "
                 + " ".join(f"{_ms(t):>9s}" for t in comm) + f" {plan.memory / 2**20:8.1f}")
    return "\n".join(lines)


def summary(plan, sample, uniform):
    """The planned step against pure sample parallelism and the best single strategy."""
    halo = (f"; of the halo calls' {_ms(plan.comm('halo'))} ms, {_ms(plan.halo_hidden_seconds)} ms hidden behind the "
            f"convolutions' interior and own cells" if plan.comm("halo") > 0 else "")
    lines = [f"predicted step: {_ms(plan.seconds)} ms blocking (compute {_ms(plan.compute_seconds)} ms, "
             f"weight-gradient allreduce {_ms(plan.grad_seconds)} ms, as --no-overlap trains); "
             f"{_ms(plan.overlapped_seconds)} ms overlapped (each allreduce behind the backward before it, "
             f"as refconv train runs, {plan.hidden:.0%} of it hidden: the machine file's overlap{halo})",
             f"memory per rank: {plan.memory / 2**30:.3f} GiB (parameters x3, saved activations, the largest "
             f"working set of one layer)"]
    for label, other in (("pure sample parallelism", sample), ("best single strategy", uniform)):
        if other is None:
            lines.append(f"{label}: not possible here (the batch is smaller than the ranks or a layer "
                         f"cannot run on it)")
            continue
        name, p = other
        lines.append(f"{label} ({name}): {_ms(p.seconds)} ms, weight-gradient allreduce {_ms(p.grad_seconds)} ms, "
                     f"{p.memory / 2**30:.3f} GiB; the plan is {p.seconds / plan.seconds:.2f}x faster")
    return "\n".join(lines)
