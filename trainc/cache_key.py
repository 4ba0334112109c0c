"""The artifact cache's key: named parts, each a hash of one thing that shapes the compiled code.

Parts (see `PARTS`) are kept apart so that a miss can say which one differed from the nearest
stored entry (trainc.explain).
"""
from __future__ import annotations

import hashlib
import os
import platform
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.fx as fx

from trainc.config import Config
from trainc import regions

FORMAT = 3
PARTS = ("graph", "inputs", "options", "trainc_source", "versions", "device", "numerics")
_source_hash: Optional[str] = None


@dataclass(frozen=True)
class Key:
    digest: str
    parts: tuple[tuple[str, str], ...]  # (part name, its hash), in PARTS order

    def __str__(self) -> str:
        return self.digest

    def differing(self, other_parts: dict) -> list[str]:
        """The part names whose hash differs from other_parts'."""
        return [name for name, h in self.parts if other_parts.get(name) != h]


def make_key(gm: fx.GraphModule, args: Sequence, kinds: Sequence, training: bool,
             config: Config, extra: tuple = ()) -> tuple[Optional[Key], str]:
    """(Key, "") or (None, why the graph cannot be keyed safely: then it is not cached)."""
    graph, why = _graph_part(gm)
    if graph is None:
        return None, why
    sig = _args_key(args)
    if sig is None:
        return None, "an input is neither a plain tensor nor a plain Python scalar"
    parts = {"graph": graph,
             "inputs": _h(sig, [str(k) for k in kinds], training, extra),
             "options": _h(repr(config)),
             "trainc_source": trainc_source(),
             "versions": _h(FORMAT, torch.__version__, _triton_version(), sys.version_info[:2]),
             "device": _h(_device_part(args)),
             "numerics": _h(_numerics())}
    ordered = tuple((p, parts[p]) for p in PARTS)
    return Key(_h(ordered)[:32], ordered), ""


def _h(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _graph_part(gm: fx.GraphModule) -> tuple[Optional[str], str]:
    """(hash of the graph's code (submodules' too) and constants, "") or (None, why not)."""
    h = hashlib.sha256()
    for mod in gm.modules():
        if not isinstance(mod, fx.GraphModule):
            return None, "the graph calls a real module (its code is not in the graph's)"
        h.update(mod.code.encode())
        tags = [(n.name, regions.tag_of(n)) for n in mod.graph.nodes if regions.tag_of(n)]
        if tags:  # trainc.policy regions live in node meta, not in the code
            h.update(repr(tags).encode())
    attrs = _tensor_attrs(gm)
    if attrs is None:
        return None, "a get_attr constant is neither a tensor nor a graph"
    for name, t in sorted(list(gm.named_parameters()) + list(gm.named_buffers()) + attrs,
                          key=lambda x: x[0]):
        h.update(name.encode() + _tensor_bytes(t))
    return h.hexdigest(), ""


def _numerics() -> tuple:
    """Global state tracing or the kernels read: default dtype, autocast, TF32, determinism,
    matmul precision, oneDNN, and the thread count (gemm choices are timed per count)."""
    autocast = tuple((d, torch.is_autocast_enabled(d), str(torch.get_autocast_dtype(d)))
                     for d in ("cpu", "cuda"))
    return (str(torch.get_default_dtype()), autocast,
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
            torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled(),
            torch.backends.cudnn.deterministic, torch.backends.mkldnn.enabled,
            torch.get_num_threads())


def _device_part(args: Sequence) -> tuple:
    """The machine the code was generated for: CPU architecture, and for CUDA inputs the
    device's name and compute capability."""
    out = [platform.machine(), os.environ.get("TRITON_INTERPRET", "")]
    for d in sorted({str(a.device) for a in args if isinstance(a, torch.Tensor)}):
        dev = torch.device(d)
        if dev.type == "cuda":
            out.append((d, torch.cuda.get_device_name(dev), torch.cuda.get_device_capability(dev)))
    return tuple(out)


def _triton_version() -> str:
    try:
        from importlib.metadata import version
        return version("triton")
    except Exception:  # not installed
        return ""


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


def trainc_source() -> str:
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
