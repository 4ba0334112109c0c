"""config.resolve decides the defaults that depend on the backend's capabilities
(codegen/target.py), the device and the entry point, in one place."""
import pytest

from trainc.codegen import target_for
from trainc.codegen.cpp.plan import CPU
from trainc.codegen.target import ATEN
from trainc.codegen.triton.plan import GPU
from trainc.config import make_config, resolve


def test_make_config_accepts_auto_cudagraphs_and_refuses_others():
    assert make_config(cudagraphs="auto").cudagraphs == "auto"
    with pytest.raises(ValueError, match="cudagraphs"):
        make_config(cudagraphs="sometimes")


@pytest.mark.parametrize("target,step,device,want", [
    (GPU, True, "cuda", "auto"), (GPU, False, "cuda", False), (GPU, True, "cpu", False),
    (CPU, True, "cpu", False), (ATEN, True, "cuda", False)])
def test_cudagraphs_default(target, step, device, want, monkeypatch):
    monkeypatch.delenv("TRAINC_CUDAGRAPHS", raising=False)
    assert resolve(make_config(), target, device, step=step).cudagraphs == want


def test_explicit_values_are_kept():
    c = make_config(cudagraphs=True, partition_objective="bytes", conv_channels_last=False)
    assert resolve(c, GPU, "cuda", step=True) == c


@pytest.mark.parametrize("target,convolutions,step,want", [
    (CPU, False, False, "balanced"), (CPU, True, False, "bytes"), (CPU, False, True, "bytes"),
    (GPU, False, False, "bytes")])
def test_partition_objective_default(target, convolutions, step, want):
    c = resolve(make_config(), target, "cpu", step=step, convolutions=convolutions)
    assert c.partition_objective == want


def test_channels_last_default_is_the_targets():
    assert resolve(make_config(), CPU, "cpu").conv_channels_last is True
    assert resolve(make_config(), GPU, "cuda").conv_channels_last == "eager_tf32"


def test_resolve_is_idempotent():
    once = resolve(make_config(), CPU, "cpu")
    assert resolve(once, CPU, "cpu") == once


def test_targets_by_backend_name():
    import torch
    assert target_for("auto", torch.device("cpu")) is CPU
    assert target_for("triton", torch.device("cpu")) is GPU
    assert target_for("aten", torch.device("cpu")) is ATEN
    assert CPU.accumulates_grads and not GPU.accumulates_grads
    assert CPU.vector_lanes == CPU.lane_widths and GPU.vector_lanes == ()
