"""The wrapper's memory, planned before the wrapper is printed: the in-place plan (inplace.py),
the alloc/reuse/free events of a schedule (walk.py), buffers kept across calls (kept.py), and
the MemoryPlan record built from them (plan.py)."""
from trainc.codegen.memory.plan import MemoryPlan, peak_rows, plan_memory

__all__ = ["MemoryPlan", "peak_rows", "plan_memory"]
