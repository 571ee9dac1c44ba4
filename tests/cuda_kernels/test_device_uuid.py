"""G8: GPUs are told apart by UUID, so two MIG slices of one GPU (one PCI bus id) are two devices.

No GPU here: CuPy's device properties are faked, as ``cudaGetDeviceProperties`` returns them
under MIG (each slice its own ``uuid``, the whole GPU's ``pciBusID``).
"""

import dataclasses
import types

import pytest

from refconv import arrays, device
from refconv.device import Binding, BindError

SLICE_0 = bytes(range(16))
SLICE_1 = bytes(range(16, 32))


def fake_cupy(properties):
    runtime = types.SimpleNamespace(getDeviceProperties=lambda i: properties[i])
    Device = lambda i: types.SimpleNamespace(pci_bus_id="00000000:3B:00.0")  # noqa: E731 (one GPU, sliced)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime, Device=Device))


@pytest.fixture
def on_a_gpu(monkeypatch):
    def use(properties):
        monkeypatch.setattr(arrays, "gpu_available", lambda: True)
        monkeypatch.setattr(arrays, "device_module", lambda: fake_cupy(properties))
    return use


def test_two_mig_slices_of_one_gpu_are_two_devices(on_a_gpu):
    on_a_gpu([{"uuid": SLICE_0}, {"uuid": SLICE_1}])
    ids = device.physical_gpu_ids(2)
    assert ids == ["GPU-00010203-0405-0607-0809-0a0b0c0d0e0f", "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"]
    # one rank per slice, each seeing its slice as device 0 (as a MIG launcher hands them out): no conflict
    ranks = [Binding(rank=r, host="node", local_rank=r, local_size=2, backend="cuda", gpu=0, gpu_id=ids[r])
             for r in range(2)]
    device.check_gpu_sharing(ranks, oversubscribe=False)
    with pytest.raises(BindError, match="2 ranks on node node share 1 GPU"):
        device.check_gpu_sharing([ranks[0], dataclasses.replace(ranks[1], gpu_id=ids[0])], oversubscribe=False)


def test_without_a_uuid_the_pci_bus_id_names_the_device(on_a_gpu):
    on_a_gpu([{}])
    assert device.physical_gpu_ids(1) == ["00000000:3B:00.0"]
