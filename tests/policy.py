"""DESIGN.md's correctness policy for tests: compare compiled and eager against a float64 run."""
import torch

TOLERANCE = {torch.float32: (2.0, 1e-5), torch.bfloat16: (3.0, 1e-3), torch.float16: (3.0, 1e-3),
             torch.float64: (2.0, 1e-12)}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double(), ref.detach().double()
    denom = ref.norm().item()
    diff = (x - ref).norm().item()
    return diff / denom if denom > 0 else diff


def _exact_parts(name: str, out, ref) -> bool:
    """Exact checks (shape, dtype, device, integer values, NaN/Inf positions); True when the
    values are floating point and still need a numeric comparison."""
    assert out.shape == ref.shape, f"{name}: shape {out.shape} != {ref.shape}"
    assert out.dtype == ref.dtype, f"{name}: dtype {out.dtype} != {ref.dtype}"
    assert out.device == ref.device, f"{name}: device {out.device} != {ref.device}"
    if not out.is_floating_point():
        assert torch.equal(out, ref), f"{name}: integer values differ\n{out}\n{ref}"
        return False
    assert torch.equal(out.isnan(), ref.isnan()), f"{name}: NaN positions differ"
    assert torch.equal(out.isinf(), ref.isinf()), f"{name}: Inf positions differ"
    return True


def assert_same(out, ref, rtol: float = 1e-5, atol: float = 1e-6, what: str = "") -> None:
    """Exact for shapes, dtypes, integers, bools and NaN/Inf positions; close for floats."""
    if _exact_parts(what, out, ref):
        torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, equal_nan=True, msg=what)


def assert_policy(name: str, compiled, eager, ref) -> None:
    """err(compiled) <= k * err(eager) + floor; exact for shape, dtype and non-float values."""
    if compiled is None or eager is None:
        assert compiled is None and eager is None, f"{name}: one side is None"
        return
    if not _exact_parts(name, compiled, eager):
        return
    finite = ref.isfinite()
    k, floor = TOLERANCE[compiled.dtype]
    ec, ee = rel_err(compiled[finite], ref[finite]), rel_err(eager[finite], ref[finite])
    assert ec <= k * ee + floor, f"{name}: err(compiled)={ec:.3g} > {k}*err(eager)={ee:.3g}+{floor}"
