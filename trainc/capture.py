"""Dynamo front end: the "trainc" backend receives FX graphs; each becomes a GraphRunner.

Dynamo supplies graphs, guards and graph breaks. A GraphRunner compiles lazily per concrete
input signature (shapes, strides, dtypes, requires_grad, grad mode), so it stays correct even
when Dynamo hands over a graph with dynamic shapes.
"""
from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

import torch
import torch.fx as fx

from trainc import records, runtime, scalars
from trainc.config import Config, make_config
from trainc.graph import InputKind
from trainc.pipeline import compile_graph


def dynamo_backend(gm: fx.GraphModule, example_inputs: Sequence, *, options: Optional[dict] = None,
                   mode: Optional[str] = None, config: Optional[Config] = None) -> "GraphRunner":
    """The `torch.compile(backend="trainc", options={...})` entry point."""
    if config is None:
        config = make_config(**(options or {}))
        if config.regions:  # a backend sees one graph; regions are set up on the model
            raise ValueError("trainc: regions='auto' needs trainc.compile(model, regions="
                             "'auto'); torch.compile(backend='trainc') cannot install them")
    reason = getattr(gm, "compile_subgraph_reason", None)
    if reason is not None and getattr(reason, "graph_break", False):
        records.note_graph_break(reason)
    return GraphRunner(gm, input_kinds(gm, example_inputs), config)


def input_kinds(gm: fx.GraphModule, example_inputs: Sequence) -> list[InputKind]:
    """Parameters, buffers and user inputs, from the tensors and Dynamo's input sources."""
    kinds = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, x in zip(placeholders, example_inputs):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = source.name if isinstance(getattr(source, "name", None), str) else str(source)
        if isinstance(x, torch.nn.Parameter) or "_parameters[" in name:
            kinds.append(InputKind.PARAM)
        elif "_buffers[" in name:
            kinds.append(InputKind.BUFFER)
        else:
            kinds.append(InputKind.USER)
    return kinds


class GraphRunner:
    """What Dynamo calls in place of the captured graph. Scalar inputs reach the compiled code
    as 0-d tensors (trainc/scalars.py); where the graph cannot take them so, their values are
    baked in and keyed on (`specialized`): a new value compiles again."""

    def __init__(self, gm: fx.GraphModule, kinds: list[InputKind], config: Config):
        self.gm, self.kinds, self.config = gm, kinds, config
        self.cache: dict[tuple, runtime.Artifact] = {}
        self.lifted: Optional[dict[int, torch.dtype]] = None  # set at the first call
        self.scalars: list[int] = []  # 0-d tensor inputs the graph reads by .item()
        self.specialized: tuple[int, ...] = ()

    def __call__(self, *args: Any) -> list:
        if self.lifted is None:
            self.traced, self.lifted = scalars.lift(self.gm, args)
            self.scalars = scalars.read_by_item(self.traced, scalars.to_tensors(args,
                                                                                self.lifted))
        if self.lifted:
            args = scalars.to_tensors(args, self.lifted)
        training = torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        key = (training, _args_key(args, self.specialized))
        art = self.cache.get(key)
        if art is None:
            art = self._compile(args, training)
            self.cache[(training, _args_key(args, self.specialized))] = art
        return runtime.run(art, args)

    def _compile(self, args: Sequence, training: bool) -> runtime.Artifact:
        if self.scalars and not self.specialized:
            try:
                return compile_graph(self.traced, args, self.kinds, training, self.config)
            except Exception as e:  # noqa: BLE001  (the specialized compile raises a real error)
                self.specialized = tuple(self.scalars)
                if self.config.debug:
                    print(f"trainc: scalar inputs {list(self.specialized)} baked in, a new value "
                          f"compiles again ({type(e).__name__}: {str(e).splitlines()[0][:200]})",
                          file=sys.stderr)
        gm = scalars.specialize(self.traced, self.specialized, args) if self.specialized \
            else self.traced
        return compile_graph(gm, args, self.kinds, training, self.config)


def _args_key(args: Sequence[Any], values: Sequence[int] = ()) -> tuple:
    """What a compiled artifact depends on, per argument (one pass: it runs on every call);
    the values of the 0-d tensors at `values` too."""
    key = tuple((a.shape, a.stride(), a.storage_offset(), a.dtype, a.device, a.requires_grad)
                if isinstance(a, torch.Tensor) else (type(a), a) for a in args)
    return key + tuple(args[i].item() for i in values) if values else key
