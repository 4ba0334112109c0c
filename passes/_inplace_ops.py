"""In-place forms aten lacks, for the reinplacing pass: trainc.slice_scatter_/select_scatter_
write `src` into a slice/select of `self` and return `self` (schemas mark the write `(a!)`)."""
from __future__ import annotations

import torch

_lib = torch.library.Library("trainc", "FRAGMENT")
_lib.define("slice_scatter_(Tensor(a!) self, Tensor src, int dim=0, SymInt? start=None, "
            "SymInt? end=None, SymInt step=1) -> Tensor(a!)")
_lib.define("select_scatter_(Tensor(a!) self, Tensor src, int dim, SymInt index) -> Tensor(a!)")


def _slice_scatter_(self: torch.Tensor, src: torch.Tensor, dim: int = 0, start=None, end=None,
                    step: int = 1) -> torch.Tensor:
    torch.ops.aten.slice.Tensor(self, dim, start, end, step).copy_(src)
    return self


def _select_scatter_(self: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    torch.ops.aten.select.int(self, dim, index).copy_(src)
    return self


_lib.impl("slice_scatter_", _slice_scatter_, "CompositeExplicitAutograd")
_lib.impl("select_scatter_", _select_scatter_, "CompositeExplicitAutograd")

SCATTER_INPLACE = {
    torch.ops.aten.slice_scatter.default: torch.ops.trainc.slice_scatter_.default,
    torch.ops.aten.select_scatter.default: torch.ops.trainc.select_scatter_.default,
}
