"""2-d pooling cases shared by the C++ and Triton lowering tests: eager ATen calls of the
forward and the backward, on inputs with ties, NaNs and infinities."""
from __future__ import annotations

import torch

aten = torch.ops.aten

# shape, kernel, stride, padding, dilation, ceil_mode
MAX_CASES = [
    ((2, 3, 7, 9), [3, 3], [2, 2], [1, 1], [1, 1], False),  # ResNet's stem pool, odd sizes
    ((2, 3, 6, 7), [2, 2], [2, 2], [0, 0], [1, 1], False),
    ((1, 2, 8, 7), [3, 2], [1, 2], [1, 0], [1, 1], True),  # overlapping, ceil_mode
    ((2, 2, 9, 10), [3, 3], [2, 3], [1, 1], [2, 1], False),  # dilation
    ((3, 7, 7), [2, 2], [2, 2], [1, 0], [1, 1], True),  # unbatched
]

# shape, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override
AVG_CASES = [
    ((2, 3, 7, 9), [3, 3], [2, 2], [1, 1], False, True, None),
    ((2, 3, 7, 9), [3, 3], [2, 2], [1, 1], False, False, None),
    ((1, 2, 8, 7), [3, 2], [1, 2], [1, 0], True, False, None),
    ((2, 2, 7, 7), [3, 3], [2, 2], [1, 1], True, True, None),  # last window past the padding
    ((2, 2, 6, 5), [2, 3], [2, 1], [0, 1], False, True, 5),
    ((2, 4, 7, 7), [20, 20], [20, 20], [0, 0], True, True, None),  # EfficientNet's pooler
    ((3, 5, 6), [2, 2], [], [0, 0], True, False, None),  # unbatched, default stride
]


def tied(shape, seed: int = 0) -> torch.Tensor:
    """Few distinct values (ties in most windows), some NaNs (two in one window) and infs."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=gen).float()
    flat = x.view(-1)
    flat[3] = flat[4] = float("nan")
    flat[11] = float("-inf")
    flat[-2] = float("inf")
    return x


def max_pool(case):
    """fn(x, g) -> (values, indices, grad_input) and its arguments."""
    shape, k, s, p, d, ceil = case

    def fn(x, g):
        y, i = aten.max_pool2d_with_indices(x, k, s, p, d, ceil)
        return y, i, aten.max_pool2d_with_indices_backward(g, x, k, s, p, d, ceil, i)
    x = tied(shape)
    y, _ = aten.max_pool2d_with_indices(x, k, s, p, d, ceil)
    return fn, (x, torch.randn(y.shape, generator=torch.Generator().manual_seed(1)))


def avg_pool(case):
    shape, k, s, p, ceil, include, div = case

    def fn(x, g):
        y = aten.avg_pool2d(x, k, s, p, ceil, include, div)
        return y, aten.avg_pool2d_backward(g, x, k, s, p, ceil, include, div)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(2))
    y = aten.avg_pool2d(x, k, s, p, ceil, include, div)
    return fn, (x, torch.randn(y.shape, generator=torch.Generator().manual_seed(3)))


def hardtanh(x):
    # eager's backward at NaN is 0 in its vector loop and the gradient in its scalar tail,
    # so the backward is compared away from NaN
    y = aten.hardtanh(x, 0.0, 6.0)
    finite = x.nan_to_num(0.5)
    return y, aten.hardtanh_backward(torch.ones_like(x) * 2, finite, 0.0, 6.0)


def special(n: int) -> torch.Tensor:
    x = torch.linspace(-8, 8, n)
    x[0], x[1], x[2], x[3], x[4] = float("nan"), float("inf"), float("-inf"), 0.0, 6.0
    return x
