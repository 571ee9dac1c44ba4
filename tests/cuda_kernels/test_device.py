"""Rank-to-GPU binding, tested with injected fakes (a fake device count, a fake
CUDA_VISIBLE_DEVICES, fake hosts): no GPU is needed to check which device a rank
picks and when a binding is refused.  The multi-rank half is tests/mpiexec/launched/test_device.py;
the real device selection runs in scripts/gpu_check.sh."""

import dataclasses

import pytest
from mpi4py import MPI

from refconv import device
from refconv.device import Binding, BindError


def row(rank, host, local_rank, local_size, gpu_id, threads=1, cores=8):
    gpu = None if gpu_id is None else 0
    return Binding(rank=rank, host=host, local_rank=local_rank, local_size=local_size, backend="cuda" if gpu_id
                   else "numpy", gpu=gpu, gpu_id=gpu_id, threads=threads, cores=cores)


def test_visible_ids_follow_cuda_visible_devices():
    assert device.visible_gpu_ids(4, env={}) == ["0", "1", "2", "3"]
    assert device.visible_gpu_ids(2, env={"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert device.visible_gpu_ids(1, env={"CUDA_VISIBLE_DEVICES": " GPU-a1b2 , GPU-c3"}) == ["GPU-a1b2"]
    assert device.visible_gpu_ids(0, env={"CUDA_VISIBLE_DEVICES": ""}) == []


@pytest.mark.parametrize("local_rank, count, expected", [(0, 4, 0), (3, 4, 3), (5, 4, 1), (2, 1, 0), (2, 0, None)])
def test_choose_gpu_is_local_rank_mod_visible(local_rank, count, expected):
    assert device.choose_gpu(local_rank, count) == expected


def test_two_ranks_on_one_gpu_are_refused_unless_asked_for():
    table = [row(r, "n1", r, 4, str(r % 2)) for r in range(4)]  # 4 ranks, 2 GPUs
    with pytest.raises(BindError, match=r"4 ranks on node n1 share 2 GPU\(s\) \(0, 1\).*--oversubscribe-gpus"):
        device.check_gpu_sharing(table, oversubscribe=False)
    device.check_gpu_sharing(table, oversubscribe=True)


def test_one_gpu_per_task_and_several_nodes_are_fine():
    # Slurm --gpus-per-task=1: every rank sees one device "0", but a different physical one.
    device.check_gpu_sharing([row(r, "n1", r, 4, str(r)) for r in range(4)], oversubscribe=False)
    # two nodes, each with its own GPUs 0 and 1
    device.check_gpu_sharing([row(r, f"n{r // 2}", r % 2, 2, str(r % 2)) for r in range(4)], oversubscribe=False)
    with pytest.raises(BindError, match="node n1"):  # the second node has one GPU for two ranks
        device.check_gpu_sharing([row(0, "n0", 0, 2, "0"), row(1, "n0", 1, 2, "1"),
                                  row(2, "n1", 0, 2, "0"), row(3, "n1", 1, 2, "0")], oversubscribe=False)


def test_opt_in_by_flag_or_environment():
    assert device.oversubscribe_requested(True, env={})
    assert device.oversubscribe_requested(None, env={device.OVERSUBSCRIBE_ENV: "1"})
    assert not device.oversubscribe_requested(None, env={device.OVERSUBSCRIBE_ENV: "0"})


def test_cpu_warning_when_threads_exceed_cores():
    assert device.cpu_warning([row(r, "n1", r, 2, None, threads=1, cores=2) for r in range(2)]) is None
    message = device.cpu_warning([row(r, "n1", r, 4, None, threads=2, cores=4) for r in range(4)])
    assert message.startswith("4 ranks x 2 threads on node n1 need more than its 4 cores")
    assert message.endswith("set OMP_NUM_THREADS=1 (cores / ranks per node)")
    message = device.cpu_warning([row(r, "n1", r, 4, None, threads=1, cores=2) for r in range(4)])
    assert message.endswith("start at most 2 ranks per node")


def test_bind_selects_the_chosen_device_with_fakes():
    picked = []
    mine, table = device.bind(MPI.COMM_WORLD, "cuda", count=3, env={"CUDA_VISIBLE_DEVICES": "5,6,7"},
                              select=picked.append, host="fake-node", warn=False)
    assert (mine.local_rank, mine.local_size, mine.gpu, mine.gpu_id, mine.simulator) == (0, 1, 0, "5", False)
    assert picked == [0] and table == [mine]


def test_a_launcher_that_renumbers_every_rank_s_gpu_to_0_is_not_a_conflict(monkeypatch):
    """Each rank sees one device, numbered 0, and no CUDA_VISIBLE_DEVICES: the PCI bus id tells them apart."""
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    monkeypatch.setattr(device, "physical_gpu_ids", lambda count, env: ["00000000:3B:00.0"][:count])
    picked = []
    mine, table = device.bind(MPI.COMM_WORLD, "cuda", env={}, select=picked.append, host="node", warn=False)
    assert (mine.gpu, mine.gpu_id, picked) == (0, "00000000:3B:00.0", [0])
    other = Binding(rank=1, host="node", local_rank=1, local_size=2, backend="cuda", gpu=0,
                    gpu_id="00000000:5E:00.0", threads=1, cores=8)
    device.check_gpu_sharing(table + [other], oversubscribe=False)  # two devices, both "0" to their ranks
    with pytest.raises(BindError, match="2 ranks on node node share 1 GPU"):
        device.check_gpu_sharing(table + [dataclasses.replace(other, gpu_id=mine.gpu_id)], oversubscribe=False)


def test_bind_on_the_cpu_selects_nothing():
    picked = []
    mine, _ = device.bind(MPI.COMM_WORLD, "numpy", count=4, select=picked.append, warn=False)
    assert mine.gpu is None and mine.backend == "numpy" and picked == []


def test_an_unknown_backend_is_named_with_the_choices():
    assert device.resolve_backend("numpy") == "numpy"
    with pytest.raises(BindError, match=r"backend: expected one of \('auto', 'numpy', 'cuda', 'shapes'\), got 'tpu'"):
        device.resolve_backend("tpu")
