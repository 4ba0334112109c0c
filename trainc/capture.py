"""Dynamo front end: the "trainc" backend receives FX graphs; each becomes a GraphRunner.

Dynamo supplies graphs, guards and graph breaks. A GraphRunner compiles lazily per concrete
input signature (shapes, strides, dtypes, requires_grad, grad mode), so it stays correct even
when Dynamo hands over a graph with dynamic shapes.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.fx as fx

from trainc import runtime
from trainc.config import Config, make_config
from trainc.graph import InputKind
from trainc.pipeline import compile_graph


def dynamo_backend(gm: fx.GraphModule, example_inputs: Sequence, *, options: Optional[dict] = None,
                   mode: Optional[str] = None, config: Optional[Config] = None) -> "GraphRunner":
    """The `torch.compile(backend="trainc", options={...})` entry point."""
    if config is None:
        config = make_config(**(options or {}))
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
    """What Dynamo calls in place of the captured graph."""

    def __init__(self, gm: fx.GraphModule, kinds: list[InputKind], config: Config):
        self.gm, self.kinds, self.config = gm, kinds, config
        self.cache: dict[tuple, runtime.Artifact] = {}

    def __call__(self, *args: Any) -> list:
        training = torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args)
        key = (training, _args_key(args))
        art = self.cache.get(key)
        if art is None:
            art = self.cache[key] = compile_graph(self.gm, args, self.kinds, training, self.config)
        return runtime.run(art, args)


def _args_key(args: Sequence[Any]) -> tuple:
    """What a compiled artifact depends on, per argument (one pass: it runs on every call)."""
    return tuple((a.shape, a.stride(), a.storage_offset(), a.dtype, a.device, a.requires_grad)
                 if isinstance(a, torch.Tensor) else (type(a), a) for a in args)
