"""Compiled artifacts on disk: a warm process skips tracing, passes, partition and codegen.

Keyed by everything that shapes the compiled code (see `key`); only graphs whose backend left
a recipe (CompiledGraph.extra["recipe"], plain data `rebuild` turns back into `run`) are stored.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import io
import os
import pickle
import tempfile
import types
from typing import Any, Optional, Sequence

import torch
import torch.fx as fx

from trainc.config import Config

_FORMAT = 2
_source_hash: Optional[str] = None


def key(gm: fx.GraphModule, args: Sequence, kinds: Sequence, training: bool,
        config: Config) -> Optional[str]:
    """The cache key, or None when the graph cannot be keyed safely (then nothing is cached):
    a hash of the graph's code (submodules' too) and constants, the input signature (shapes,
    strides, dtypes, devices, requires_grad, shared storage), input kinds, training, config,
    default dtype and autocast modes, torch version and trainc's own source."""
    if not config.cache_artifacts or config.debug_dir:
        return None
    h = hashlib.sha256()
    for part in (_FORMAT, torch.__version__, _trainc_source(), repr(config), training,
                 [str(k) for k in kinds], _ambient()):
        h.update(repr(part).encode() + b"\0")
    for mod in gm.modules():
        if not isinstance(mod, fx.GraphModule):
            return None  # a real module called from the graph: its code is not in gm.code
        h.update(mod.code.encode())
    attrs = _tensor_attrs(gm)
    if attrs is None:
        return None
    for name, t in sorted(list(gm.named_parameters()) + list(gm.named_buffers()) + attrs,
                          key=lambda x: x[0]):
        h.update(name.encode() + _tensor_bytes(t))
    sig = _args_key(args)
    if sig is None:
        return None
    h.update(repr(sig).encode())
    return h.hexdigest()[:32]


def _ambient() -> tuple:
    """Global state tracing reads: the default dtype and the autocast modes."""
    modes = tuple((d, torch.is_autocast_enabled(d), str(torch.get_autocast_dtype(d)))
                  for d in ("cpu", "cuda"))
    return str(torch.get_default_dtype()), modes


def _args_key(args: Sequence) -> Optional[list]:
    out, seen = [], {}
    for a in args:
        if isinstance(a, torch.Tensor):
            if type(a) not in (torch.Tensor, torch.nn.Parameter):
                return None  # tensor subclasses (fake, functional, ...): not keyed
            ptr = a.untyped_storage().data_ptr() if a.numel() else -1 - len(out)
            out.append((tuple(a.shape), a.stride(), a.storage_offset(), str(a.dtype),
                        str(a.device), a.requires_grad, seen.setdefault(ptr, len(out))))
        elif a is None or isinstance(a, (bool, int, float, str)):
            out.append((type(a).__name__, repr(a)))
        else:
            return None
    return out


def _tensor_attrs(gm: fx.GraphModule) -> Optional[list]:
    """The graphs' get_attr constants; None when one is neither a tensor nor a graph."""
    out = []
    for m in gm.modules():
        for n in m.graph.nodes:
            if n.op != "get_attr":
                continue
            v = m
            for part in str(n.target).split("."):
                v = getattr(v, part, None)
            if isinstance(v, torch.Tensor):
                out.append((str(n.target), v))
            elif not isinstance(v, fx.GraphModule):
                return None
    return out


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    return repr((tuple(t.shape), str(t.dtype))).encode() + \
        t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _trainc_source() -> str:
    """A hash of every source file of the trainc packages (computed once per process)."""
    global _source_hash
    if _source_hash is None:
        import trainc
        import trainc.codegen
        import trainc.partition
        import trainc.passes
        h = hashlib.sha256()
        roots = sorted({os.path.dirname(m.__file__) for m in
                        (trainc, trainc.codegen, trainc.partition, trainc.passes)})
        for root in roots:
            for d, subdirs, files in sorted(os.walk(root)):
                subdirs.sort()
                for f in sorted(files):
                    if f.endswith((".py", ".h")):
                        with open(os.path.join(d, f), "rb") as fh:
                            h.update(f.encode() + fh.read())
        _source_hash = h.hexdigest()
    return _source_hash


def _path(k: str, config: Config) -> str:
    d = os.path.join(config.cache_dir or os.path.join(os.path.expanduser("~"), ".cache",
                                                      "trainc"), "artifacts")
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, f"a_{k}.pkl")


class _Pickler(pickle.Pickler):
    """ATen ops and modules (torch) by name: neither pickles by value."""

    def reducer_override(self, obj: Any):
        if isinstance(obj, torch._ops.OpOverload):
            return _op, (obj._schema.name, obj._overloadname)
        if isinstance(obj, types.ModuleType):
            return importlib.import_module, (obj.__name__,)
        return NotImplemented


def _op(qualified: str, overload: str):
    ns, name = qualified.split("::")
    return getattr(getattr(getattr(torch.ops, ns), name), overload or "default")


def store(k: Optional[str], art: Any, record: Any, config: Config) -> bool:
    """Write the artifact when every compiled graph has a recipe; never raises."""
    graphs = [g for g in (art.fwd, art.bwd, art.bwd_acc) if g is not None]
    if k is None or not all("recipe" in g.extra for g in graphs):
        return False
    return _write(_path(k, config), (art.signature, [_plain(g) for g in
                                                   (art.fwd, art.bwd, art.bwd_acc)],
                                      record, art.acc))


def store_variant(k: Optional[str], layout: tuple, graph: Any, config: Config) -> bool:
    """One backward compiled for expanded tangents (runtime.ExpandedBackwards), next to the
    artifact stored under k."""
    if k is None or "recipe" not in graph.extra:
        return False
    return _write(_variant_path(k, layout, config), _plain(graph))


def load_variant(k: Optional[str], layout: tuple, config: Config) -> Optional[Any]:
    if k is None:
        return None
    g = _read(_variant_path(k, layout, config))
    return None if g is None else _build(g, config)


def _variant_path(k: str, layout: tuple, config: Config) -> str:
    return _path(f"{k}_t{hashlib.sha256(repr(layout).encode()).hexdigest()[:16]}", config)


def _write(path: str, payload: Any) -> bool:
    try:
        buf = io.BytesIO()
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(payload)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(buf.getvalue())
        os.replace(tmp, path)  # readers never see a half-written file
        return True
    except Exception:  # an unpicklable graph (a Python callable in it, ...): not cached
        return False


def _read(path: str) -> Optional[Any]:
    if not os.path.exists(path):
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # truncated or from an incompatible version: recompile
        return None


def _plain(g) -> Optional[dict]:
    if g is None:
        return None
    return {f.name: getattr(g, f.name) for f in dataclasses.fields(g) if f.name != "run"}


def load(k: Optional[str], config: Config) -> Optional[tuple]:
    """(Artifact, GraphRecord) stored under k, or None."""
    if k is None:
        return None
    from trainc.runtime import Artifact, ExpandedBackwards
    stored = _read(_path(k, config))
    if stored is None:
        return None
    sig, graphs, record, acc = stored
    built = [None if g is None else _build(g, config) for g in graphs]
    expanded = ExpandedBackwards(None, (k, config)) if built[1] is not None else None
    return Artifact(sig, *built, acc, expanded), record


def _build(g: dict, config: Config):
    from trainc.codegen import CompiledGraph
    kind, recipe = g["extra"]["recipe"]
    return CompiledGraph(run=_rebuild(kind, recipe, config), **g)


def _rebuild(kind: str, recipe: Any, config: Config):
    if kind == "cpp":
        from trainc.codegen.cpp import rebuild
        return rebuild(recipe, config)
    raise KeyError(f"trainc: no rebuild for recipe kind {kind!r}")
