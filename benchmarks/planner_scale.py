"""How long the partitioner takes on a deep transformer: the shared suite's GPT (cpu widths) with
N layers, joint graph captured from trainc.compile, then partition() timed without a budget and
at the first budget (the whole candidate sweep) and a second one (cached sweep).

    python benchmarks/planner_scale.py --layers 32
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "shared", "bench"))
import models  # noqa: E402

import trainc  # noqa: E402
from trainc import pipeline  # noqa: E402
from trainc.config import make_config  # noqa: E402
from trainc.partition import partition  # noqa: E402


class _Captured(Exception):
    pass


def joint_of_gpt(layers: int):
    torch.manual_seed(0)
    model = models.GPT(vocab=512, d=128, heads=4, layers=layers, seq=64)
    idx = torch.randint(0, 512, (4, 64))
    joints = []

    def capture(joint, config):
        joints.append(joint)
        raise _Captured

    real, pipeline.partition = pipeline.partition, capture
    try:
        trainc.compile(model, backend="aten")(idx)
    except _Captured:
        pass
    finally:
        pipeline.partition = real
    return joints[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--backend", default="cpp")
    args = ap.parse_args()
    t0 = time.perf_counter()
    joint = joint_of_gpt(args.layers)
    print(f"layers {args.layers}: joint graph {len(joint.gm.graph.nodes)} nodes, traced in "
          f"{time.perf_counter() - t0:.1f} s")
    print("| budget | partition s | simulated peak MiB |")
    print("|---|---|---|")
    for budget in (None, 0.5, 0.0):
        config = make_config(backend=args.backend, memory_budget=budget,
                             partition_objective="bytes")
        t = time.perf_counter()
        part = partition(joint, config)
        print(f"| {budget} | {time.perf_counter() - t:.2f} | {part.memory.peak / 2**20:.1f} |")


if __name__ == "__main__":
    main()
