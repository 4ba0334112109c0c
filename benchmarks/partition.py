"""Saved activation bytes: trainc's partitions vs PyTorch's min_cut_rematerialization_partition.

    python benchmarks/partition.py [names...]

For each shared-suite model (scale "cpu", float32): bytes the forward keeps for the backward under
PyTorch's min-cut (through functorch.compile.aot_module; forward outputs that are neither graph
inputs, views of inputs, nor user outputs) and under trainc (default min-cut, save_all, budget 0).
Prints a markdown table.
"""
from __future__ import annotations

import os
import sys

import torch
from torch.multiprocessing.reductions import StorageWeakRef

HERE = os.path.dirname(os.path.abspath(__file__))
for bench in (os.path.join(HERE, "suite_models"),):
    if os.path.isdir(bench):
        sys.path.insert(0, bench)

import models  # noqa: E402
import trainc  # noqa: E402


def _storage(node):
    v = node.meta.get("val")
    return StorageWeakRef(v.untyped_storage()) if isinstance(v, torch.Tensor) else None


def torch_saved(name: str) -> tuple[int, int]:
    """(bytes, tensors) PyTorch's min-cut partition saves for the backward."""
    from functorch.compile import aot_module, make_boxed_func, min_cut_rematerialization_partition
    model, inputs, _ = models.build(name)
    found = {}

    def fw_compiler(gm, _):
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        input_storages = {_storage(n) for n in placeholders} - {None}
        total, count, seen = 0, 0, set()
        for o in gm.graph.output_node().args[0]:
            if not isinstance(o, torch.fx.Node) or o in placeholders:
                continue
            st, v = _storage(o), o.meta.get("val")
            if st is None or st in input_storages or st in seen:
                continue
            seen.add(st)
            total += v.untyped_storage().nbytes()
            count += 1
        found["saved"] = (total, count)
        return make_boxed_func(gm.forward)

    compiled = aot_module(model, fw_compiler=fw_compiler,
                          bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                          partition_fn=min_cut_rematerialization_partition)
    out = compiled(*inputs)
    outs = out if isinstance(out, (tuple, list)) else [out]
    user = sum(t.untyped_storage().nbytes() for t in outs)
    total, count = found["saved"]
    return total - user, count - len(outs)


def trainc_saved(name: str, **options) -> tuple[int, int]:
    model, inputs, _ = models.build(name)
    e = trainc.explain(model, *inputs, backend="aten", **options)
    return e.saved_bytes, len(e.saved_tensors)


def main() -> None:
    names = sys.argv[1:] or models.NAMES
    print("| model | PyTorch min-cut B (tensors) | trainc default B (tensors) | trainc budget 0 B "
          "| trainc save_all B | default / PyTorch |")
    print("|---|---|---|---|---|---|")
    for name in names:
        tb, tc = torch_saved(name)
        db, dc = trainc_saved(name)
        zb, _ = trainc_saved(name, memory_budget=0.0)
        ab, _ = trainc_saved(name, partitioner="save_all")
        ratio = f"{db / tb:.2f}" if tb else "-"
        print(f"| {name} | {tb:,} ({tc}) | {db:,} ({dc}) | {zb:,} | {ab:,} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
