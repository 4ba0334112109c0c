"""A budget's trial partitions (pipeline._trial_graphs: lazy GraphModules, no Python code made)
predict what the full path gives: the same MemoryPlans as eagerly built graphs through the
post-grad passes, the wrapper's own plan from generate(), and the same predicted step peaks."""
import os

import pytest
import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

from trainc import pipeline
from trainc.codegen import memory_planner
from trainc.codegen.driver import generate
from trainc.config import make_config
from trainc.partition import build_partition, generates_kernels
from trainc.partition import budget as B
from trainc.partition import policy as P
from trainc.partition.cost import CostModel
from trainc.partition.mincut_choose import OBJECTIVES, budget_plans
from trainc.partition.step_peak import plans_step_peak

from test_budget_layers import _layers_joint

BACKENDS = ["cpp", pytest.param("triton", marks=pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="Triton on CPU needs TRITON_INTERPRET=1"))]


def _plan_facts(p):
    return (p.events, p.forms, p.storage, p.kept, p.arena_bytes, p.inputs, p.live_bytes,
            p.peak_bytes)


@pytest.mark.parametrize("name", BACKENDS)
def test_trial_graphs_plan_as_the_full_path(name):
    joint = _layers_joint(layers=3, batch=256, width=64, hidden=256)
    config, backend = pipeline.backend_for(make_config(backend=name, memory_budget=0.5),
                                           torch.device("cpu"))
    costs = CostModel(joint.gm, P.DEFAULT_POLICY, fuses=generates_kernels(config))
    default = B.evaluate(joint, costs, OBJECTIVES["bytes"](joint, costs), "default")
    plans = [default, *budget_plans(joint, costs, default)[:3]]  # the default, then leaner
    assert len(plans) >= 2
    planner, predict = memory_planner(backend), pipeline._predictor(backend, config)(joint, costs)
    for k, plan in enumerate(plans):
        fwd, bwd, part = pipeline._trial_graphs(joint, costs, plan, config)
        assert isinstance(fwd, _LazyGraphModule) and isinstance(bwd, _LazyGraphModule)
        full = build_partition(joint, costs, list(plan.saved), "budget", None, observe=False)
        ffwd = pipeline.post_grad(full.fwd, joint.signature, config)
        fbwd = pipeline.post_grad(full.bwd, None, config)
        assert not isinstance(ffwd, _LazyGraphModule)
        plans_of = []
        for lazy, eager in ((fwd, ffwd), (bwd, fbwd)):
            assert lazy.code == eager.code  # the same graph, its code made only when asked
            got = planner(lazy, pipeline._example_inputs(lazy))
            want = planner(eager, pipeline._example_inputs(eager))
            assert _plan_facts(got) == _plan_facts(want)
            if k == 0:  # the wrapper's plan, kernels built (the fastest rung is enough)
                built = generate(backend, eager, pipeline._example_inputs(eager))
                assert _plan_facts(built.extra["memory_plan"]) == _plan_facts(got)
            plans_of.append(want)
        assert predict(plan) == plans_step_peak(full, *plans_of).peak
