"""Lowered-graph and schedule dumps (codegen/dumps.py: 40_lowered.txt, 41_schedule.txt under
TRAINC_DEBUG_DIR): pinned by golden files on a small net, so an unintended change to lowering or
scheduling shows here. Regenerate with TRAINC_UPDATE_GOLDEN=1."""
import os

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import trainc
from trainc import decomps
from trainc.codegen import is_extern
from trainc.codegen.graph import lower
from trainc.codegen.lowerings import LOWERINGS
from trainc.codegen.scheduler import Kernel, schedule

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 4),
                         nn.Softmax(-1))


def _dumps(tmp_path, backend: str) -> dict[str, str]:
    x = torch.randn(4, 16)
    out = trainc.compile(_net(), backend=backend, debug_dir=str(tmp_path),
                         cache_artifacts=False)(x)
    out.sum().backward()
    return {name: next(tmp_path.rglob(name)).read_text()
            for name in ("40_lowered.txt", "41_schedule.txt")}


def _check_golden(text: str, golden: str) -> None:
    path = os.path.join(GOLDEN, golden)
    if os.environ.get("TRAINC_UPDATE_GOLDEN") == "1":
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read(), f"{golden} changed; if intended: TRAINC_UPDATE_GOLDEN=1 " \
                                 f"pytest {__file__}"


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_lowered_and_schedule_dumps_match_golden(tmp_path, backend):
    dumps = _dumps(tmp_path, backend)
    for name, text in dumps.items():
        assert "# forward" in text and "# backward" in text, name
        _check_golden(text, f"net_{backend}_{name}")


def _lowered(fn, *args):
    gm = make_fx(fn, decomposition_table=decomps.TABLE, tracing_mode="fake")(*args)
    return lower(gm, LOWERINGS, is_extern)


def test_printing_leaves_the_symbol_table_alone():
    """A dump builds expressions over its own symbols: the graph's table (which numbers the
    analysis symbols) is the same printed or not."""
    g = _lowered(lambda x: (torch.softmax(x, -1) * 2,), torch.randn(4, 8))
    before = len(g.symbols.made)
    text = str(g)
    assert len(g.symbols.made) == before
    assert text == str(g)


def test_lowered_dump_names_every_buffer_and_step():
    g = _lowered(lambda x, w: (torch.relu(x @ w).sum(0),), torch.randn(4, 8), torch.randn(8, 3))
    text = str(g)
    for name, buf in g.buffers.items():
        assert f"  {name}: {buf.kind} " in text
    assert "extern aten.mm.default(arg0, arg1)" in text
    assert "sum over r[4]" in text and "maximum(" in text


def test_shared_subexpressions_are_named_once():
    g = _lowered(lambda x: (torch.exp(x + 1) * torch.exp(x + 1),), torch.randn(4, 8))
    text = str(g)
    assert "    t0 = exp(add(arg0[8*c0 + c1], 1.0:f32))\n    = mul(t0, t0)\n" in text


def test_schedule_dump_lists_kernels_and_calls():
    g = _lowered(lambda x, w: (torch.relu(x @ w) + 1,), torch.randn(4, 8), torch.randn(8, 3))
    sched = schedule(g)
    text = str(sched)
    kernels = [k for k in sched.items if isinstance(k, Kernel)]
    assert text.startswith(f"# schedule: {len(kernels)} kernels, 1 calls")
    for k in kernels:
        assert f"{k.name}: loops" in text
    assert text.index("extern aten.mm") < text.index(kernels[-1].name)
