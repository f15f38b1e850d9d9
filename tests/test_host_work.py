"""What a step of each method asks of the host on the CUDA-graph path, counted on a CPU: the torch
operations it runs outside the graphs, besides views (`scripts/host_cost.py`'s count). On a GPU
each is a launch from Python, and a small model's step waits for them, so a change that adds any
to a method's step shows here before a GPU measures it. The graphs are `test_graphs`' replaying
stand-ins, the models tiny; a budget is a method's count today and a little room, a step's
average over one answer (how many a step runs depends on what its proposal holds). Nor may a
step walk a model's parameters (transformers' `model.device` does, a few microseconds a module):
a request reads what it needs of them once."""

from unittest import mock

import pytest
import torch
from test_conformance import configurations

from specdemo.core.events import final_summary

from conftest import load_script, make_tiny_model

# operations a step outside the graphs, besides views: at most
BUDGETS = {"ar": 6, "speculative, feature draft, tree": 23, "speculative, feature draft, static tree": 32,
           "speculative, token draft, tree": 22, "speculative, feature draft, chain": 37, "medusa, dynamic tree": 12,
           "medusa, static tree": 15, "lookahead": 7, "cllm, lookahead": 9, "jacobi": 7}


@pytest.fixture(scope="module")
def host_cost():
    return load_script("host_cost")


@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_a_step_stays_within_its_operations_outside_the_graphs(host_cost, prompt_ids, name):
    target = make_tiny_model()
    generate, options, model = configurations(target, make_tiny_model(seed=1))[name]
    clock = host_cost.Clock()
    graphed, functions = host_cost.stand_ins(clock)  # as `static.compile_passes` with CUDA
    given = host_cost.graphed_companions(options, model, graphed, functions)
    walks, parameters = [], torch.nn.Module.parameters

    def walked(module, *args, **kwargs):  # outside the graphs: a replay's Python runs on a CPU only
        walks.extend([] if clock.replaying else [type(module).__name__])
        return parameters(module, *args, **kwargs)

    for _ in range(2):  # the first answer captures what its first use does (a tree's look-back passes)
        operations, walks[:] = host_cost.Operations(clock), []
        events = generate(model, prompt_ids, max_new_tokens=48, eos_token_ids=(), **options, **given)
        first = next(events)  # the prompt's pass is no step's work
        with operations, mock.patch.object(torch.nn.Module, "parameters", walked):
            rest = list(events)
    steps = final_summary([first, *rest]).target_forwards - 1
    work = sum(count for kind, count in operations.kinds.items() if kind not in host_cost.VIEWS)
    assert steps > 4 and operations.graphed  # the passes replayed their graphs
    assert work / steps <= BUDGETS[name], dict(operations.kinds)
    assert not walks


@pytest.mark.parametrize("name", ["ar", "speculative", "medusa", "lookahead", "cllm"])
def test_the_tiny_mode_times_each_method_outside_the_graphs(host_cost, name):
    """`host_cost.py --tiny`: each method's configuration here, its steps timed outside the replays."""
    clock = host_cost.Clock()
    graphed, functions = host_cost.stand_ins(clock)
    operations = host_cost.Operations(clock)
    outside, steps = host_cost.measure_tiny(name, graphed, functions, clock, 32, operations)
    assert steps > 4 and outside > 0 and operations.graphed and sum(operations.kinds.values()) > 0
    cold = host_cost.Clock(evict=1 << 20)  # `--cold`: writes after each replay, which count as no operation
    graphed, functions = host_cost.stand_ins(cold)
    evicted = host_cost.Operations(cold)
    assert host_cost.measure_tiny(name, graphed, functions, cold, 32, evicted)[1] == steps
    assert evicted.kinds == operations.kinds and evicted.graphed == operations.graphed
