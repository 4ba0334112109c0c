"""Lane reductions with one block of lanes (NHWC batch-norm statistics: 16 channels, one lane
block) would run on one OpenMP thread: the threads split the first reduced dim instead, each
keeps partial accumulators, and after a barrier every thread folds the partials in thread order
(deterministic for a given thread count). Stores of values all threads hold go through thread 0."""
from __future__ import annotations

from typing import Callable

SPLIT_MAX_THREADS = 64  # partial slots per accumulator (threads beyond this are not used)


def split_threads_header(threads: int = SPLIT_MAX_THREADS) -> list[str]:
    """Opens the kernel's parallel region of at most `threads`; `tid`/`nth` name the thread and
    the team size."""
    return [f"  #pragma omp parallel num_threads(std::min(omp_get_max_threads(), {threads}))",
            "  {",
            "    const int64_t tid = omp_get_thread_num(), nth = omp_get_num_threads();"]


def split_for(sym: str, size: int) -> str:
    """This thread's static share of `for (sym = 0; sym < size; ++sym)`."""
    chunk = f"(({size} + nth - 1) / nth)"
    return (f"for (int64_t {sym} = tid * {chunk}; {sym} < std::min<int64_t>({size}, "
            f"(tid + 1) * {chunk}); ++{sym}) {{")


def gather_partials(accs: list[tuple[str, str, Callable]], lanes: int,
                    threads: int = SPLIT_MAX_THREADS) -> tuple[list[str], list[str]]:
    """(shared partial arrays to declare before the region, statements after the reduction
    loop). `accs`: (C type, accumulator base name, combine(a, b) -> statement) per accumulator
    variable; lane accumulators are arrays of `lanes`, indexed by j; `threads`: the most
    threads of the region."""
    decls = [f"  alignas(64) {t} p_{v}[{threads * lanes}];" for t, v, _ in accs]
    put = " ".join(f"p_{v}[tid * {lanes} + j] = {v}[j];" for _, v, _ in accs)
    take = " ".join(f"{v}[j] = p_{v}[j];" for _, v, _ in accs)
    fold = " ".join(c(f"{v}[j]", f"p_{v}[t * {lanes} + j]") for _, v, c in accs)
    body = [f"for (int64_t j = 0; j < {lanes}; ++j) {{ {put} }}",
            "#pragma omp barrier",
            f"for (int64_t j = 0; j < {lanes}; ++j) {{",
            f"  {take}",
            f"  for (int64_t t = 1; t < nth; ++t) {{ {fold} }}",
            "}"]
    return decls, body
