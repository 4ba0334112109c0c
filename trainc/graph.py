"""The data every stage passes along with its torch.fx.GraphModule: small frozen records.

Joint graph layout (the invariant all stages keep):
  placeholders  primals_0 .. primals_{n-1} (graph inputs, then `seed` when has_rng), tangents_*
  outputs       [new values of mutated inputs] + [computed forward outputs] + [grads]
Node facts live in node.meta: "val" (FakeTensor) on every node.
"""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx

# node.meta key: a saved value compile_step moves to host memory between its forward readers
# and its backward ones (its partition name; codegen/memory/offload.py plan_inner)
OFFLOAD_NODE = "trainc_offload_node"


def graph_device(gm: fx.GraphModule, example_inputs=()) -> torch.device:
    """The device a graph computes on: the first non-CPU device of its example inputs or of
    its nodes' values (a graph without inputs may still make CUDA tensors: factory ops with
    device=), else CPU. CPU 0-d tensors (the RNG seed, Python scalars) sit beside either."""
    vals = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    vals += [n.meta.get("val", n.meta.get("example_value")) for n in gm.graph.nodes]
    for v in vals:
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            return v.device
    return torch.device("cpu")


class InputKind(enum.Enum):
    PARAM = "param"
    BUFFER = "buffer"
    USER = "user"
    SEED = "seed"  # the RNG seed trainc adds; the runtime draws it from torch's generator
    STATE = "optimizer_state"  # compile_step: optimizer state tensors (momentum, exp_avg, ...)
    SCALAR = "scalar"  # compile_step: hyperparameters (lr, betas, ...) as 0-d tensors


class OutputKind(enum.Enum):
    COMPUTED = "computed"  # produced by the compiled forward
    ALIAS_OF_INPUT = "alias_of_input"  # regenerated at runtime as a view of input `base`
    ALIAS_OF_OUTPUT = "alias_of_output"  # regenerated as a view of computed output `base`


@dataclass(frozen=True)
class InputInfo:
    name: str
    kind: InputKind
    requires_grad: bool
    mutates_data: bool = False
    mutates_metadata: bool = False


@dataclass(frozen=True)
class OutputInfo:
    """One user-visible output of the captured graph."""
    kind: OutputKind
    base: int = -1  # input index or computed-output index, for the alias kinds
    size: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    storage_offset: int = 0  # relative to the base's storage offset
    requires_grad: bool = False


@dataclass(frozen=True)
class GraphSignature:
    inputs: tuple[InputInfo, ...]  # graph inputs in order; SEED last when has_rng
    outputs: tuple[OutputInfo, ...]  # user-visible outputs in order
    computed: int  # forward outputs the compiled graph produces (user + hidden alias bases)
    computed_strides: tuple[tuple[int, ...], ...]  # eager's layout of each computed output
    tangents: tuple[int, ...]  # computed-output indices that get a tangent
    grads: tuple[int, ...]  # input indices the graph returns a grad for (others get None)
    training: bool  # False: inference graph, no tangents, no grads

    @functools.cached_property  # read several times per call by the runtime
    def mutated_inputs(self) -> tuple[int, ...]:
        return tuple(i for i, x in enumerate(self.inputs) if x.mutates_data)

    @property
    def has_rng(self) -> bool:
        return bool(self.inputs) and self.inputs[-1].kind is InputKind.SEED

    @property
    def num_fwd_outputs(self) -> int:
        """Mutated-input values + computed outputs: the forward half of the joint outputs."""
        return len(self.mutated_inputs) + self.computed


@dataclass(frozen=True)
class JointGraph:
    gm: fx.GraphModule
    signature: GraphSignature
    attention_rewrites: int = 0  # explicit attentions traced as SDPA (trainc/attention.py)
    chunked_losses: int = 0  # LM-head cross-entropies traced in row chunks (trainc/chunked_loss.py)
    sdpa_rewrites: int = 0  # SDPA calls made causal / GQA (trainc/sdpa_rewrite.py)


def val(node: fx.Node) -> Optional[torch.Tensor]:
    """The FakeTensor (or scalar) a node produces, as recorded by tracing."""
    return node.meta.get("val")


def nbytes(v: object) -> int:
    """Bytes a value occupies (0 for non-tensors); sizes are concrete here."""
    if not isinstance(v, torch.Tensor):
        if isinstance(v, (list, tuple)):
            return sum(nbytes(x) for x in v)
        return 0
    return int(v.numel()) * v.element_size()


def is_dense(shape, stride) -> bool:
    """True when a layout's elements occupy distinct memory with no gaps (some dim order)."""
    expected = 1
    for size, st in sorted((d for d in zip(shape, stride) if d[0] != 1), key=lambda d: d[1]):
        if st != expected:
            return False
        expected *= size
    return True
