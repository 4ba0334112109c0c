"""Graph passes, one per file (file name = function name), and the ordered lists the driver runs.

Every pass maps GraphModule -> GraphModule; `run_passes` times each one and dumps the graph
after it when a debug directory is set.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import torch.fx as fx

from trainc.passes.remove_aliases import remove_aliases
from trainc.passes.remove_dead_code import remove_dead_code

Pass = Callable[[fx.GraphModule], fx.GraphModule]

# Run on the joint graph, before the partition.
JOINT_PASSES: list[Pass] = [remove_aliases, remove_dead_code]
# Run on the forward and backward graphs separately, after the partition.
POST_GRAD_PASSES: list[Pass] = [remove_dead_code]


def run_passes(gm: fx.GraphModule, passes: Sequence[Pass], *, dump: Optional[Callable] = None,
               prefix: str = "10", timings: Optional[dict] = None) -> fx.GraphModule:
    """Apply `passes` in order; `dump(name, gm)` after each; seconds per pass into `timings`."""
    for i, p in enumerate(passes):
        t0 = time.perf_counter()
        gm = p(gm)
        if timings is not None:
            timings[p.__name__] = timings.get(p.__name__, 0.0) + time.perf_counter() - t0
        if dump is not None:
            dump(f"{prefix}_{i}_{p.__name__}.py", gm)
    return gm
