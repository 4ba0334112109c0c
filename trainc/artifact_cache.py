"""Compiled artifacts on disk: a warm process skips tracing, passes, partition and codegen.

An entry (artifacts/a_<key>.json) holds the compiled graphs as JSON (trainc/cache_codec.py):
their wrapper and kernel source text, launch and tuning choices, and the GraphRecord that
`trainc.explain` reports; tensors live in blobs/ by content hash, C++ libraries in cpp/ next
to their checksum (codegen/cpp/build.py). Only graphs whose backend left a recipe
(CompiledGraph.extra["recipe"]: plain data `rebuild` turns back into `run`) are stored. Files
go through trainc/cache_store.py: a refused directory turns caching off, a corrupt entry is a
miss (warned once) that the recompile overwrites.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional, Sequence

import torch.fx as fx

from trainc import cache_codec, cache_store
from trainc.cache_key import Key, make_key
from trainc.config import Config

_NEAREST_SCAN = 256  # entries compared on a miss, newest first (explain's "nearest entry")


def key(gm: fx.GraphModule, args: Sequence, kinds: Sequence, training: bool,
        config: Config, extra: tuple = ()) -> Optional[Key]:
    """The cache key, or None when nothing is cached (off, dumping, or not keyable)."""
    return key_and_reason(gm, args, kinds, training, config, extra)[0]


def key_and_reason(gm, args, kinds, training, config, extra: tuple = ()) -> tuple:
    if not config.cache_artifacts:
        return None, "off (cache_artifacts=False)"
    if config.debug_dir:
        return None, "off (debug_dir: every stage runs to be dumped)"
    k, why = make_key(gm, args, kinds, training, config, extra)
    return k, (f"not cached ({why})" if k is None else "")


def _dirs(config: Config) -> Optional[tuple[str, str]]:
    art, blobs = cache_store.subdir(config, "artifacts"), cache_store.subdir(config, "blobs")
    return None if art is None or blobs is None else (art, blobs)


def _entry_path(d: str, k: str) -> str:
    return os.path.join(d, f"a_{k}.json")


# -- store -----------------------------------------------------------------------------------
def store(k: Optional[Key], art: Any, record: Any, config: Config) -> str:
    """Write the artifact when every compiled graph has a recipe; never raises. What happened,
    in words ("stored", or why not)."""
    graphs = [g for g in (art.fwd, art.bwd, art.bwd_acc) if g is not None]
    if k is None:
        return "not stored"
    if not all("recipe" in g.extra for g in graphs):
        return "not stored (a graph's backend leaves no recipe)"
    payload = {"signature": art.signature, "graphs": [_plain(g) for g in
                                                      (art.fwd, art.bwd, art.bwd_acc)],
               "record": record, "acc": art.acc}
    return _write(k, str(k), payload, config)


def store_variant(k: Optional[Key], layout: tuple, graph: Any, config: Config) -> str:
    """One backward compiled for expanded tangents (runtime.ExpandedBackwards), next to the
    artifact stored under k."""
    if k is None or "recipe" not in graph.extra:
        return "not stored"
    return _write(k, _variant_name(k, layout), {"graph": _plain(graph)}, config)


def store_graph(k: Optional[Key], graph: Any, record: Any, config: Config) -> str:
    """One compiled graph and its record (compile_step's whole-step graph)."""
    if k is None or "recipe" not in graph.extra:
        return "not stored"
    return _write(k, str(k), {"graph": _plain(graph), "record": record}, config)


def _write(k: Key, name: str, payload: dict, config: Config) -> str:
    dirs = _dirs(config)
    if dirs is None:
        return "not stored (cache directory refused)"
    art_dir, blob_dir = dirs
    try:
        data = cache_codec.encode(payload, lambda b: cache_store.put_blob(blob_dir, b))
        body = json.dumps({"format": 1, "data": data}).encode()
        cache_store.write_entry(_entry_path(art_dir, name), body, {"parts": dict(k.parts)})
        return "stored"
    except cache_codec.Unencodable as e:
        return f"not stored (cannot encode {e})"
    except OSError as e:
        return f"not stored ({e})"


def _plain(g) -> Optional[dict]:
    if g is None:
        return None
    return {f.name: getattr(g, f.name) for f in dataclasses.fields(g) if f.name != "run"}


# -- load ------------------------------------------------------------------------------------
def load(k: Optional[Key], config: Config) -> tuple[Optional[tuple], str]:
    """((Artifact, GraphRecord) stored under k, or None; "hit" or why it missed)."""
    if k is None:
        return None, "not cached"
    from trainc.runtime import Artifact, ExpandedBackwards
    stored, status = _read(k, str(k), config)
    if stored is None:
        return None, status
    try:
        built = [None if g is None else _build(g, config) for g in stored["graphs"]]
        expanded = ExpandedBackwards(None, (k, config)) if built[1] is not None else None
        return (Artifact(stored["signature"], *built, stored["acc"], expanded),
                stored["record"]), "hit"
    except Exception as e:  # decoded, but does not fit this trainc: recompile over it
        return None, _corrupt(k, str(k), config, f"cannot rebuild it ({type(e).__name__}: {e})")


def load_graph(k: Optional[Key], config: Config) -> tuple[Optional[tuple], str]:
    """((CompiledGraph, record) stored by store_graph, or None; status)."""
    if k is None:
        return None, "not cached"
    stored, status = _read(k, str(k), config)
    if stored is None:
        return None, status
    try:
        return (_build(stored["graph"], config), stored["record"]), "hit"
    except Exception as e:
        return None, _corrupt(k, str(k), config, f"cannot rebuild it ({type(e).__name__}: {e})")


def lookup_graph(gm: fx.GraphModule, args: Sequence, sig: Any, extra: tuple,
                 config: Config) -> tuple[Optional[Key], Optional[tuple], str]:
    """(key, (CompiledGraph, record) or None, status) for a traced graph compiled whole
    (compile_step's step graph: keyed after tracing, it skips passes, partition, codegen)."""
    k, status = key_and_reason(gm, args, [str(i.kind) for i in sig.inputs], True, config,
                               extra)
    if k is None:
        return None, None, status
    cached, status = load_graph(k, config)
    return k, cached, status


def load_variant(k: Optional[Key], layout: tuple, config: Config) -> Optional[Any]:
    if k is None:
        return None
    stored, _ = _read(k, _variant_name(k, layout), config)
    if stored is None:
        return None
    try:
        return _build(stored["graph"], config)
    except Exception as e:
        _corrupt(k, _variant_name(k, layout), config, f"cannot rebuild it ({e})")
        return None


def _variant_name(k: Key, layout: tuple) -> str:
    return f"{k}_t{cache_store.sha256(repr(layout).encode())[:16]}"


def _read(k: Key, name: str, config: Config) -> tuple[Optional[dict], str]:
    dirs = _dirs(config)
    if dirs is None:
        return None, "off (cache directory refused; see the warning)"
    art_dir, blob_dir = dirs
    path = _entry_path(art_dir, name)
    if not os.path.exists(path):
        return None, "miss (" + _nearest(k, art_dir) + ")"
    try:
        body = json.loads(cache_store.read_entry(path))
        return cache_codec.decode(body["data"], lambda h: cache_store.get_blob(blob_dir, h)), ""
    except (cache_store.CorruptEntry, ValueError, TypeError, KeyError, AttributeError,
            ImportError, OSError) as e:
        return None, _corrupt(k, name, config, str(e))


def _corrupt(k: Key, name: str, config: Config, why: str) -> str:
    where = os.path.join(cache_store.root(config), "artifacts", name)
    cache_store.warn_once(f"corrupt:{where}", f"trainc: ignoring a bad cache entry, recompiling "
                          f"over it: {why}")
    return f"miss (bad entry: {why})"


def _nearest(k: Key, art_dir: str) -> str:
    """Which key parts differ from the stored entry sharing the most parts with k."""
    try:
        names = [n for n in os.listdir(art_dir) if n.startswith("a_") and "_t" not in n[2:]]
    except OSError:
        return "no entries"
    paths = sorted((os.path.join(art_dir, n) for n in names), key=_mtime, reverse=True)
    best: Optional[list] = None
    for path in paths[:_NEAREST_SCAN]:
        try:
            parts = cache_store.read_header(path).get("parts")
        except (cache_store.CorruptEntry, OSError):
            continue
        if isinstance(parts, dict):
            diff = k.differing(parts)
            if best is None or len(diff) < len(best):
                best = diff
    if best is None:
        return "no entries"
    return "nearest entry differs in: " + (", ".join(best) or "nothing (same key)")


def _mtime(path: str) -> float:
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def _build(g: dict, config: Config):
    from trainc.codegen import CompiledGraph
    kind, recipe = g["extra"]["recipe"]
    return CompiledGraph(run=_rebuild(kind, recipe, config), **g)


def _rebuild(kind: str, recipe: Any, config: Config):
    if kind == "cpp":
        from trainc.codegen.cpp import rebuild
        return rebuild(recipe, config)
    if kind == "triton":
        from trainc.codegen.triton import rebuild
        return rebuild(recipe, config)
    raise KeyError(f"trainc: no rebuild for recipe kind {kind!r}")
