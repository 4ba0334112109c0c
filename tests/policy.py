"""DESIGN.md's correctness policy for tests: compare compiled and eager against a float64 run."""
import torch

TOLERANCE = {torch.float32: (2.0, 1e-5), torch.bfloat16: (3.0, 1e-3), torch.float16: (3.0, 1e-3),
             torch.float64: (2.0, 1e-12)}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double(), ref.detach().double()
    denom = ref.norm().item()
    diff = (x - ref).norm().item()
    return diff / denom if denom > 0 else diff


def assert_policy(name: str, compiled, eager, ref) -> None:
    """err(compiled) <= k * err(eager) + floor; exact for shape, dtype and non-float values."""
    if compiled is None or eager is None:
        assert compiled is None and eager is None, f"{name}: one side is None"
        return
    assert compiled.shape == eager.shape, f"{name}: shape {compiled.shape} != {eager.shape}"
    assert compiled.dtype == eager.dtype, f"{name}: dtype {compiled.dtype} != {eager.dtype}"
    if not compiled.is_floating_point():
        assert torch.equal(compiled, eager), f"{name}: integer values differ"
        return
    assert torch.equal(compiled.isnan(), eager.isnan()), f"{name}: NaN positions differ"
    assert torch.equal(compiled.isinf(), eager.isinf()), f"{name}: Inf positions differ"
    finite = ref.isfinite()
    k, floor = TOLERANCE[compiled.dtype]
    ec, ee = rel_err(compiled[finite], ref[finite]), rel_err(eager[finite], ref[finite])
    assert ec <= k * ee + floor, f"{name}: err(compiled)={ec:.3g} > {k}*err(eager)={ee:.3g}+{floor}"
