"""Compiled graphs and their records <-> JSON, for the artifact cache (no pickle).

Plain data is JSON; tensors go to content-hashed blobs; ATen ops, modules and functions are
stored by name and looked up again only inside torch and trainc (and a few stdlib modules);
trainc's own data classes and enums by class name and fields. Anything else cannot be encoded
(Unencodable: that graph is not cached).
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import math
import types
from typing import Any, Callable

import torch

# Modules whose objects may be named in an entry (looked up by name, never executed from it).
_TRUSTED = ("torch", "trainc", "math", "operator", "builtins", "triton")


class Unencodable(TypeError):
    pass


def _trusted(module: str) -> bool:
    return isinstance(module, str) and module.split(".")[0] in _TRUSTED


def encode(obj: Any, put_blob: Callable[[bytes], str]) -> Any:
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"float": repr(obj)}
    if isinstance(obj, (list, tuple)):
        return {"list" if isinstance(obj, list) else "tuple": [encode(x, put_blob) for x in obj]}
    if isinstance(obj, dict):
        return {"dict": [[encode(k, put_blob), encode(v, put_blob)] for k, v in obj.items()]}
    if isinstance(obj, (set, frozenset)):
        items = sorted((encode(x, put_blob) for x in obj), key=repr)
        return {"frozenset" if isinstance(obj, frozenset) else "set": items}
    if isinstance(obj, torch.dtype):
        return {"dtype": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"device": str(obj)}
    if isinstance(obj, torch.Size):
        return {"size": list(obj)}
    if isinstance(obj, torch.Tensor):
        return _encode_tensor(obj, put_blob)
    if isinstance(obj, torch._ops.OpOverload):
        return {"op": [obj._schema.name, obj._overloadname]}
    if isinstance(obj, torch._ops.OpOverloadPacket):
        return {"oppacket": obj._qualified_op_name}
    if isinstance(obj, types.ModuleType):
        if not _trusted(obj.__name__):
            raise Unencodable(f"module {obj.__name__}")
        return {"module": obj.__name__}
    if isinstance(obj, enum.Enum):
        return {"enum": _ref(type(obj)), "value": encode(obj.value, put_blob)}
    if isinstance(obj, type) or callable(obj) and not _is_trainc_object(obj):
        return {"ref": _ref(obj)}
    if _is_trainc_object(obj):
        state = _fields(obj)
        return {"obj": _ref(type(obj)), "state": {k: encode(v, put_blob) for k, v in state.items()}}
    raise Unencodable(f"{type(obj).__module__}.{type(obj).__qualname__}")


def decode(data: Any, get_blob: Callable[[str], bytes]) -> Any:
    if data is None or isinstance(data, (bool, int, float, str)):
        return data
    if not isinstance(data, dict) or not data:
        raise ValueError(f"not an encoded value: {str(data)[:80]}")
    tag = next(iter(data))
    v = data[tag]
    d = lambda x: decode(x, get_blob)  # noqa: E731
    if tag == "float":
        return float(v)
    if tag in ("list", "tuple", "set", "frozenset"):
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](map(d, v))
    if tag == "dict":
        return {d(k): d(x) for k, x in v}
    if tag == "dtype":
        return _dtype(v)
    if tag == "device":
        return torch.device(v)
    if tag == "size":
        return torch.Size(v)
    if tag == "tensor":
        return _decode_tensor(data, get_blob)
    if tag == "op":
        ns, name = v[0].split("::")
        return getattr(getattr(getattr(torch.ops, ns), name), v[1] or "default")
    if tag == "oppacket":
        ns, name = v.split("::")
        return getattr(getattr(torch.ops, ns), name)
    if tag == "module":
        if not _trusted(v):
            raise ValueError(f"untrusted module {v!r}")
        return importlib.import_module(v)
    if tag == "enum":
        return _resolve(v)(d(data["value"]))
    if tag == "ref":
        return _resolve(v)
    if tag == "obj":
        cls = _resolve(v)
        if not isinstance(cls, type) or not cls.__module__.startswith("trainc"):
            raise ValueError(f"not a trainc class: {v!r}")
        obj = cls.__new__(cls)
        for k, x in data["state"].items():
            object.__setattr__(obj, k, d(x))  # frozen dataclasses too
        return obj
    raise ValueError(f"unknown tag {tag!r}")


def _is_trainc_object(obj: Any) -> bool:
    """An instance of a trainc class holding plain fields (dataclass or __dict__)."""
    cls = type(obj)
    return cls.__module__.startswith("trainc") and not isinstance(obj, (type, types.FunctionType))\
        and (dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"))


def _fields(obj: Any) -> dict:
    if dataclasses.is_dataclass(obj):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return dict(vars(obj))


def _ref(obj: Any) -> list:
    """[module, qualified name] of a function or class that resolves back to the same object."""
    objclass = getattr(obj, "__objclass__", None)  # a method descriptor (torch.Tensor.addmm_)
    if objclass is not None:
        module, name = objclass.__module__, f"{objclass.__qualname__}.{obj.__name__}"
    else:
        module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if module is None and getattr(obj, "__self__", None) is not None:  # torch._C builtins
        module = getattr(obj.__self__, "__name__", None)
    tries = [[module, name]] + [[root, getattr(obj, "__name__", "")] for root in _ROOTS]
    for ref in tries:
        if not (_trusted(ref[0]) and isinstance(ref[1], str) and ref[1] and "<" not in ref[1]):
            continue
        try:
            found = _resolve(ref)
        except (ValueError, ImportError, AttributeError):
            continue
        if found is obj:
            return ref
    raise Unencodable(f"callable {obj!r} (not found by name in torch or trainc)")


# Where builtins without a usable __module__ (torch.addmm, ...) are looked up by name.
_ROOTS = ("torch", "torch._C", "torch._C._nn", "torch.nn.functional", "torch._C._VariableFunctions")


def _resolve(ref: Any) -> Any:
    module, name = ref
    if not _trusted(module):
        raise ValueError(f"untrusted module {module!r}")
    out = importlib.import_module(module)
    for part in name.split("."):
        out = getattr(out, part)
    return out


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"not a dtype: {name!r}")
    return dt


def _encode_tensor(t: torch.Tensor, put_blob: Callable[[bytes], str]) -> dict:
    if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.is_sparse or t.is_quantized:
        raise Unencodable(f"tensor of type {type(t).__name__}")
    if t.numel() and torch._debug_has_internal_overlap(t) == 1:  # expanded: no strided copy
        raise Unencodable("a tensor whose elements overlap")
    flat = t.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {"tensor": put_blob(raw), "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape), "stride": list(t.stride()), "device": str(t.device),
            "requires_grad": t.requires_grad}


def _decode_tensor(data: dict, get_blob: Callable[[str], bytes]) -> torch.Tensor:
    dtype, shape = _dtype(data["dtype"]), data["shape"]
    raw = bytearray(get_blob(data["tensor"]))
    flat = torch.frombuffer(raw, dtype=torch.uint8).view(dtype) if raw else \
        torch.empty(0, dtype=dtype)
    t = torch.empty_strided(shape, data["stride"], dtype=dtype, device=data["device"])
    t.copy_(flat.reshape(shape))
    return t.requires_grad_(data["requires_grad"])
