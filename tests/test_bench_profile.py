"""``python -m refconv.bench.torch_step profile``'s split of a step into layers and convolution passes."""

from mpi4py import MPI

from refconv.bench.torch_step import _part_times, refconv_step_of


def test_part_times_name_every_layer_and_pass_and_sum_to_the_step():
    step, model, _, _ = refconv_step_of("digits-cnn", 4, MPI.COMM_SELF)
    parts, per_step = _part_times(model, step, rounds=1)
    layers = [f"layer {i} {type(layer).__name__} {way}" for i, (_, layer) in enumerate(model.named_layers())
              for way in ("forward", "backward")]
    convs = [f"layer {i} DistConv2d {way}:  {p}" for i, (_, layer) in enumerate(model.named_layers())
             if type(layer).__name__ == "DistConv2d"
             for way, p in [("forward", "forward"), ("backward", "backward-data"), ("backward", "backward-filter")]]
    assert sorted(parts) == sorted(layers + convs + ["rest (loss, optimizer, data)"])
    assert all(seconds >= 0 for seconds in parts.values())
    assert abs(sum(s for part, s in parts.items() if ":" not in part) - per_step) < 1e-9 * max(1.0, per_step)
    # the wrappers are gone afterwards: the layers' and backend's own methods again
    assert all("forward" not in layer.__dict__ and "backward" not in layer.__dict__ for _, layer in model.named_layers())
