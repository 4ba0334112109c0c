"""Helpers for partition tests: trace small functions to joint graphs, capture suite joints."""
from __future__ import annotations

import torch
import torch.fx as fx

import trainc
from trainc import pipeline
from trainc.config import make_config
from trainc.graph import InputKind
from trainc.joint import trace_joint
from trainc.partition import partition
from trainc.passes import JOINT_PASSES, run_passes


def joint_of(fn, *args):
    """The joint graph of `fn(*args)` (every tensor input a user input), after joint passes."""
    import dataclasses
    gm = fx.symbolic_trace(fn)
    joint = trace_joint(gm, args, [InputKind.USER] * len(args), True)
    return dataclasses.replace(joint, gm=run_passes(joint.gm, JOINT_PASSES))


def split(joint, **options):
    return partition(joint, make_config(**options))


def saved_activations(part) -> dict[str, int]:
    return {d.name: d.nbytes for d in part.decisions if d.action == "saved" and not d.is_input}


def capture_joints(monkeypatch, model, inputs) -> list:
    """Compile `model` with trainc and return the joint graphs the pipeline partitions."""
    joints = []
    real = pipeline.partition

    def spy(joint, config):
        joints.append(joint)
        return real(joint, config)

    monkeypatch.setattr(pipeline, "partition", spy)
    torch._dynamo.reset()
    trainc.compile(model, backend="aten")(*inputs)
    return joints
