"""docs/figures/algorithm_figures.py writes its four figures (computed from the code's layouts)."""

import importlib.util
import pathlib

from refconv.algorithms.stationary_w import StationaryW
from refconv.algorithms.stationary_x import StationaryX
from refconv.algorithms.stationary_y import StationaryY

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "figures" / "algorithm_figures.py"
NAMES = ("spatial", "stationary_x", "stationary_y", "stationary_w")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load_script():
    spec = importlib.util.spec_from_file_location("algorithm_figures", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_figures_are_written(tmp_path):
    paths = load_script().main(str(tmp_path))
    assert sorted(pathlib.Path(p).name for p in paths) == sorted(f"{n}.png" for n in NAMES)
    for name in NAMES:
        png = tmp_path / f"{name}.png"
        assert png.exists(), f"{png} was not written"
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC, f"{png} is not a PNG"
        assert len(data) > 5 * 1024, f"{png} is only {len(data)} bytes"


def test_layouts_come_from_the_weight_distributions():
    """The W figure's C_b is non-contiguous; X and Y reduce to one contiguous piece per rank."""
    fig = load_script()

    w = fig.channel_layouts(StationaryW, C=9, F=7, P_c=4, filter_groups=2)
    assert w["conv_in"][0] == [(0, 3), (5, 7)]          # C_b of rank (a=0, b=0): blocks 0 and 2
    assert w["conv_out"][0] == [(0, 4)]                 # F_a of rank (0, 0): blocks 0 and 1
    assert fig.groups_of(w["conv_in"]) == [[0, 2], [1, 3]]   # the p_f ranks (., b)
    x = fig.channel_layouts(StationaryX, C=9, F=7, P_c=4)
    assert x["conv_in"] == x["x_loc"] and x["conv_out"] == [[(0, 7)]] * 4
    y = fig.channel_layouts(StationaryY, C=9, F=7, P_c=4)
    assert y["conv_out"] == y["y_loc"] and y["conv_in"] == [[(0, 9)]] * 4
    halo = fig.halo_of((4, 1), (9, 4), (3, 1), (1, 1), (3, 0), (3, 1))
    assert sum(o.intersect(halo.window[1]) is not None for o in halo.owned) == 4
