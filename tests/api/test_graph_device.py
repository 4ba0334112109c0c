"""Which device a graph computes on (trainc/graph.py graph_device): a graph without CUDA inputs
may still make CUDA tensors (factory ops with device=, as HF BART's attention mask after a graph
break), and its outputs must stay there."""
import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode

import trainc
from trainc.codegen import get_backend
from trainc.graph import graph_device


def _factory_graph(device: str) -> fx.GraphModule:
    """A graph with no inputs whose one node makes a tensor on `device` (a fake value)."""
    g = fx.Graph()
    n = g.call_function(torch.ops.aten.full.default, ([4, 4], 2.0),
                        {"device": torch.device(device), "dtype": torch.float32})
    with FakeTensorMode():
        n.meta["val"] = torch.full((4, 4), 2.0, device=device)
    g.output((n,))
    return fx.GraphModule(torch.nn.Module(), g)


def test_a_graph_without_inputs_computes_where_its_nodes_are():
    assert graph_device(_factory_graph("cuda")).type == "cuda"
    assert graph_device(_factory_graph("cpu")).type == "cpu"
    cpu_scalar = torch.tensor(3.0)  # a CPU 0-d input beside CUDA nodes: still CUDA
    assert graph_device(_factory_graph("cuda"), [cpu_scalar]).type == "cuda"


def test_cpp_refuses_a_graph_that_computes_on_cuda():
    backend = get_backend("cpp", torch.device("cpu"), None)
    with pytest.raises(RuntimeError, match=r"backend='cpp' runs CPU tensors; this graph "
                                           r"computes on cuda"):
        backend.device(_factory_graph("cuda"), [])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_tensor_made_without_inputs_stays_on_cuda():
    """The first graph (before the break) has no inputs: its output is a CUDA tensor, which the
    next graph adds to a CUDA input."""
    torch._dynamo.reset()

    def f(x):
        mask = torch.full((64, 64), 2.0, device="cuda").tril()
        torch._dynamo.graph_break()
        return (x * mask).sum()
    x = torch.randn(64, 64, device="cuda")
    got = trainc.compile(f)(x)
    assert got.device.type == "cuda"
    torch.testing.assert_close(got, f(x))
