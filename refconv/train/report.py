"""What a run of ``refconv train`` reports at its end: the summary of time, bytes and overlap per
step (:func:`format_summary`), the overlap measured on every rank beside the planner's prediction
(--metrics-out's last line), and --timeline's drawing.  :mod:`refconv.train` exports
``format_summary``."""

import warnings

from refconv import collectives, overlap
from refconv.pricing import machine as machine_mod


TIMELINE_STEPS = 4  # --timeline draws the run's steps 2 to 4 (the first warms the caches)


def overlap_report(cfg, comm, model, hidden, drawn, steps, metrics):
    """Collective: every rank's overlap figures (:func:`refconv.overlap.hidden_by_kind` summed over
    the steps) to every rank, the planner's prediction beside them; --metrics-out's last line, and
    --timeline's file (rank 0)."""
    per_rank = collectives.allgather_object(comm, hidden)
    predicted = predicted_overlap(cfg, model)
    metrics.write(summary={"steps": steps, "overlap_per_rank": per_rank, "predicted": predicted})
    if cfg.timeline:
        rows = collectives.allgather_object(comm, drawn)
        if comm.Get_rank() == 0:
            keep = [name for name in rows[0]][1:] or list(rows[0])   # the first step only if it is all
            title = (f"{model.spec.get('name', 'model') if model.spec else 'model'}, {comm.Get_size()} ranks, "
                     f"{'overlapped' if cfg.overlap else '--no-overlap'}")
            overlap.write_timeline(cfg.timeline, [{name: r[name] for name in keep} for r in rows], title)
    return {"overlap": per_rank, "overlap_predicted": predicted}


def predicted_overlap(cfg, model):
    """What the planner predicted of the overlap, in words: a planned file's record (``plan:``), or
    with ``--algorithm auto`` the machine's share hidden of each gradient allreduce; else None."""
    spec = model.spec or {}
    planned = spec.get("plan")
    if isinstance(planned, dict) and "allreduce_hidden" in planned:
        text = (f"refconv plan (machine {planned.get('machine')}, {planned.get('ranks')} ranks): weight-gradient "
                f"allreduce {planned.get('grad_allreduce_ms', 0):.3f} ms per step, {planned['allreduce_hidden']:.0%} "
                f"of it hidden")
        if planned.get("halo_ms"):
            text += f"; halo {planned['halo_ms']:.3f} ms, {planned.get('halo_hidden_ms', 0):.3f} ms of it hidden"
        return text
    if cfg.algorithm == "auto" or (spec.get("defaults") or {}).get("algorithm") == "auto":
        with warnings.catch_warnings():      # "no machine file given" was said when auto chose the algorithms
            warnings.simplefilter("ignore")
            m = machine_mod.load(cfg.machine or (spec.get("defaults") or {}).get("machine"))
        return f"the planner's machine {m.name}: {m.overlap:.0%} of each weight-gradient allreduce hidden"
    return None


def format_summary(result):
    """The end-of-run report: time per step and bytes per step by kind of collective."""
    lines = [f"trained {result['steps']} steps: {result['time_per_step'] * 1e3:.1f} ms per step, "
             + next((f"final test {m} {result[m]:.4f}" if result[m] is not None else f"no test {m} (shapes-only run)")
                    for m in ("accuracy", "mse") if m in result),
             "communication per step and rank (mean over ranks):",
             f"  {'collective':<16}{'calls':>8}{'bytes':>14}"]
    total = 0
    for kind, b in result["bytes_per_step"].items():
        lines.append(f"  {kind:<16}{result['calls_per_step'][kind]:>8.1f}{b:>14,.0f}")
        total += b
    lines.append(f"  {'total':<16}{'':>8}{total:>14,.0f}")
    if "overlap" in result:
        lines += overlap.summary_lines(result["overlap"], result["steps"], result.get("overlap_predicted"))
    return "\n".join(lines)
