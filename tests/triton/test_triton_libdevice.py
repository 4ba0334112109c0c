"""Ops printed through libdevice on GPU (pow with a tensor exponent, tan, sinh, cosh, erfc) also
run under TRITON_INTERPRET, where the prelude's tl-primitive stand-ins replace libdevice."""
import torch

from triton_helpers import check


def test_pow_with_tensor_exponent_special_cases():
    a = torch.tensor([0.9, 2.0, -2.0, 0.0, -2.0, 1.0, float("nan"), 3.0, 0.0], dtype=torch.float64)
    b = torch.tensor([3.0, 0.5, 3.0, 2.0, 0.5, float("nan"), 0.0, -2.0, -1.0],
                     dtype=torch.float64)
    check(lambda a, b: (torch.pow(a, b), torch.pow(a.float(), b.float())), a, b)


def test_hyperbolic_and_tan_and_erfc():
    x = torch.linspace(-1.2, 1.2, 13)
    check(lambda x: (torch.tan(x), torch.sinh(x), torch.cosh(x), torch.erfc(x)), x)
