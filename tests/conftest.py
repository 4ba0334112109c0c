"""Shared test setup: make tests/ helpers and the shared benchmark suite importable."""
import os
import sys

# Without a GPU, Triton kernels run on CPU tensors through its interpreter. It must be set
# before anything imports triton, so here, not in tests/triton/.
if not os.environ.get("TRITON_INTERPRET"):
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
BENCH = os.path.join(HERE, "..", "..", "shared", "bench")
if os.path.isdir(BENCH):
    sys.path.insert(0, os.path.abspath(BENCH))
