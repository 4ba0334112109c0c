"""Column sums on the GPU: the weight gradients of RMSNorm and LayerNorm (a few [tokens, hidden]
tensors multiplied and summed over the tokens), trainc against torch.compile, interleaved in one
process, CUDA events, median.

    python benchmarks/column_sums.py [--out DIR] [--iters 50]
        [--set COLUMN_PARTS=32,COLUMN_MIN_PART=256 --set COLUMN_MIN_TOTAL=1e18 ...]

Each `--set` is one trainc variant: constants of trainc.codegen.split_reductions set before its
compile (the default variant uses the module's values). GB/s counts the bytes read and written
once, over the kernels' time (`kernel_us`, from the profiler); `us` is a call's wall time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

os.environ["TRAINC_CACHE_ARTIFACTS"] = "0"  # the variants differ only in module constants
import trainc  # noqa: E402
from trainc.codegen import split_reductions  # noqa: E402

# (name, tensor shape, number of [tokens, hidden] gradients added up before the product)
CASES = (
    ("llama_post_attn", (4, 2048, 2048), 2),
    ("llama_input", (4, 2048, 2048), 3),
    ("bert_layernorm", (16, 512, 768), 1),
    ("vit_layernorm", (64, 197, 768), 1),
)


def weight_grad(*ts):
    """sum over tokens of (g_1 + ... + g_k) * x (x: the normalized input)."""
    *gs, x = ts
    return (sum(gs[1:], gs[0]) * x).sum((0, 1))


def timed(fn, args, iters: int) -> list[float]:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(iters):
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return out


def device_us(fn, args, iters: int) -> float:
    """Kernel time per call (the profiler's CUDA time): launch overhead left out, which at
    these sizes is as large as the kernels."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn(*args)
        torch.cuda.synchronize()
    return sum(getattr(e, "device_time_total", 0) or e.cuda_time_total for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA) / iters


def variant(text: str) -> dict:
    return {k: int(float(v)) for k, v in (kv.split("=") for kv in text.split(",") if kv)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--set", action="append", default=[], dest="sets")
    a = ap.parse_args(argv)
    torch._dynamo.config.cache_size_limit = 64
    defaults = {k: getattr(split_reductions, k) for k in dir(split_reductions) if k.isupper()}
    variants = {"trainc": {}, **{f"trainc[{s}]": variant(s) for s in a.sets}}
    rows = []
    for name, shape, k in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        args = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
                for _ in range(k + 1)]
        nbytes = sum(t.numel() * t.element_size() for t in args) + shape[-1] * 2
        fns = {"eager": weight_grad, "inductor": torch.compile(lambda *ts: weight_grad(*ts))}
        for label, settings in variants.items():
            for key, value in {**defaults, **settings}.items():
                setattr(split_reductions, key, value)
            fn = trainc.compile(lambda *ts: weight_grad(*ts))
            fn(*args)  # compiles under these constants
            fns[label] = fn
        for key, value in defaults.items():
            setattr(split_reductions, key, value)
        ref = weight_grad(*[t.double() for t in args])
        for fn in fns.values():
            fn(*args)
        times = {m: [] for m in fns}
        for _ in range(5):
            for m, fn in fns.items():
                times[m] += timed(fn, args, a.iters // 5)
        row = {"case": name, "shape": shape, "terms": k, "MB": round(nbytes / 1e6, 1)}
        for m, fn in fns.items():
            ms = statistics.median(times[m])
            err = (fn(*args).double() - ref).abs().max().item()
            kern = device_us(fn, args, 10)
            row[m] = dict(us=round(ms * 1e3, 1), kernel_us=round(kern, 1),
                          GBps=round(nbytes / kern / 1e3), max_err=err)
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(os.path.join(a.out, "column_sums.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
