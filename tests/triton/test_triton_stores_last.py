"""A loop of few elements storing several values prints every store after its loads
(plan.LoopPlan.stores_last): one program has nothing to hide a load's latency behind, and a load
printed after a store waits for it (BatchNorm's num_batches_tracked += 1, one per layer, packed
into one program). Values, in place too, stay those of eager."""
import re

import torch

import trainc
from triton_helpers import DEVICE, check


def _kernels(source: str) -> list[str]:
    return re.split(r"@triton.jit", source)[1:]


def test_small_loops_store_after_loading():
    a, b, c = (torch.arange(3.0) + k for k in range(3))
    comp = check(lambda a, b, c: (a + 1, b * 2, c - 1), a, b, c)
    assert "stores last" in comp.extra["kernel_plans"], comp.extra["kernel_plans"]
    kern = next(k for k in _kernels(comp.source) if k.count("tl.store") == 3)
    lines = kern.splitlines()
    last_load = max(i for i, s in enumerate(lines) if "tl.load" in s)
    first_store = min(i for i, s in enumerate(lines) if "tl.store" in s)
    assert last_load < first_store, kern
    # a large pointwise kernel keeps each store by its value
    big = [torch.randn(1 << 14) for _ in range(2)]
    comp = check(lambda x, y: (x + 1, y * 2), *big)
    assert "stores last" not in comp.extra["kernel_plans"]


def test_in_place_counters_of_batch_norms_match_eager():
    torch.manual_seed(0)
    m = torch.nn.Sequential(*[torch.nn.BatchNorm1d(4) for _ in range(5)]).to(DEVICE)
    ref = torch.nn.Sequential(*[torch.nn.BatchNorm1d(4) for _ in range(5)]).to(DEVICE)
    ref.load_state_dict(m.state_dict())
    x = torch.randn(8, 4, device=DEVICE)
    f = trainc.compile(m, backend="triton")
    for _ in range(2):
        f(x).sum().backward()
        ref(x).sum().backward()
    for (name, got), want in zip(m.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(got, want, msg=name)
    assert all(int(bn.num_batches_tracked) == 2 for bn in m)
