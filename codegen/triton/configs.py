"""A kernel's launch shape -> the launch configs it may run with: the heuristic (untuned) config
first, then the autotune candidates. Decided when the kernel is planned (codegen/triton/plan.py);
the launcher (launch.py) only picks among them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LaunchConfig:
    XBLOCK: int
    RBLOCK: int = 0  # looped reductions only
    num_warps: int = 4
    num_stages: int = 1

    def __str__(self) -> str:
        r = f" R{self.RBLOCK}" if self.RBLOCK else ""
        return f"X{self.XBLOCK}{r} w{self.num_warps} s{self.num_stages}"


def next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def heuristic(kind: str, xnumel: int, rnumel: int, rblock: int, column: bool) -> LaunchConfig:
    """The untuned config (and the first candidate) of a kernel of this launch kind ("1d",
    "2d", "split", "scatter") and size. Looped and column configs are the ones that won most
    often when every candidate was timed on the H200 (BENCHMARKS.md, session 9)."""
    if kind == "split":
        return LaunchConfig(1, 2048, 8)
    if kind in ("1d", "scatter"):
        x = min(1024, next_pow2(max(xnumel, rnumel, 1)))
        return LaunchConfig(max(x, 16), 0, 4 if x <= 1024 else 8)
    if rblock:
        x = max(1, min(next_pow2(xnumel), 2048 // rblock))
        return LaunchConfig(x, 0, 4 if x * rblock <= 2048 else 8)
    if column:  # loads run along x: wide x, short r (coalesced, few registers)
        x, r = min(64, next_pow2(xnumel)), min(64, next_pow2(rnumel))
        return LaunchConfig(x, r, 8 if x * r >= 4096 else 4, 2)
    r = min(512, next_pow2(rnumel))  # a few rows per program, pipelined loads
    x = max(1, min(next_pow2(xnumel), 2048 // r))
    return LaunchConfig(x, r, 8 if x * r >= 2048 else 4, 2)


def candidates(kind: str, xnumel: int, rnumel: int, rblock: int,
               column: bool) -> tuple[LaunchConfig, ...]:
    """Launch configs worth timing (each one is a Triton compile on first use): the heuristic
    and the runner-up of each kernel class. Timing every config of a wider set on the shared
    models (338 kernels, H200) left the best of these two within 1% of the best of all, in
    total time, at 2 compiles per kernel instead of ~5."""
    h = heuristic(kind, xnumel, rnumel, rblock, column)
    if kind == "scatter":
        return (h,)
    if kind == "split":
        out = [LaunchConfig(1, 1024, 4), LaunchConfig(1, 4096, 8)]
    elif kind == "1d":
        out = [LaunchConfig(x, 0, 4) for x in (512, 1024) if x <= 2 * next_pow2(xnumel)]
    elif rblock:
        # two 4096-element rows per program: never the H200's pick for normact's rows, and
        # their compile took 2.1-2.4 s against 1.0-1.3 s for one row (session 17)
        xs = [x for x in (1, 2, 4, 8, 16, 32, 64) if 256 <= x * rblock <= 4096
              and x <= next_pow2(xnumel)] or [1]
        out = [LaunchConfig(x, 0, 4) for x in xs[:2]]
    elif column:
        out = [LaunchConfig(min(32, next_pow2(xnumel)), min(64, next_pow2(rnumel)), 4, 2)]
    else:
        out = [LaunchConfig(min(16, next_pow2(xnumel)), min(128, next_pow2(rnumel)), 4, 2)]
    return (h, *(c for c in dict.fromkeys(out) if c != h))
