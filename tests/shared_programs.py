"""Programs that the C++ and the Triton backend tests both run."""
import torch


def scatters(x, i, s, onehot_rows):
    """scatter with one index per row (value and src), slice_scatter (with a step) and
    select_scatter: all pointwise selects, no fallback."""
    A = torch.ops.aten
    return (torch.zeros_like(x).scatter_(1, i, -1.0) * onehot_rows,
            x.scatter(0, i.T[:1], s[:1, :5]), x.scatter(1, i[:3], 2.5),
            A.slice_scatter(x, s[:, 1:6:2] * 2, 1, 1, 6, 2), A.slice_scatter(x, s[1:3], 0, -4, -2),
            A.select_scatter(x, s[:, 4], 1, -3), A.select_scatter(x, s[0], 0, 2))
