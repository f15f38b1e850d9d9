"""What a step of each method asks of the host on the CUDA-graph path, counted on a CPU: the torch
operations it runs outside the graphs, besides views (`scripts/host_cost.py`'s count). On a GPU
each is a launch from Python, and a small model's step waits for them, so a change that adds any
to a method's step shows here before a GPU measures it. The graphs are `test_graphs`' replaying
stand-ins, the models tiny; a budget is a method's count today and a little room, a step's
average over one answer (how many a step runs depends on what its proposal holds). So are the
step's waits for the device (a read of what it computed, `host_cost.Waits`) and the operations the
host runs after one while the device idles, until it queues the next graph. Nor may a step walk a
model's parameters (transformers' `model.device` does, a few microseconds a module): a request
reads what it needs of them once."""

import itertools
from unittest import mock

import pytest
import torch
from test_conformance import configurations

from conftest import load_script, make_tiny_model

# operations a step outside the graphs, besides views: at most
BUDGETS = {"ar": 6, "speculative, feature draft, tree": 23, "speculative, feature draft, static tree": 32,
           "speculative, token draft, tree": 22, "speculative, feature draft, chain": 37, "medusa, dynamic tree": 12,
           "medusa, static tree": 15, "lookahead": 7, "cllm, lookahead": 9, "jacobi": 7}
# waits for the device a step (docs/gpu.md: a static tree's step waits once; a token draft's tree once a level from
# its third), and operations besides views a step while the device then idles: at most
WAITS = {"ar": (1, 3.5), "speculative, feature draft, tree": (2, 12.5),
         "speculative, feature draft, static tree": (1, 9.5), "speculative, token draft, tree": (3, 7),
         "speculative, feature draft, chain": (2, 12.5), "medusa, dynamic tree": (2, 6.5),
         "medusa, static tree": (1, 3), "lookahead": (1, 4.5), "cllm, lookahead": (1, 4.5), "jacobi": (1, 4.5)}


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
        with mock.patch.object(torch.nn.Module, "parameters", walked):
            timed = host_cost.timed_answer(itertools.chain([first], events), clock,
                                           (operations, host_cost.Waits(clock)))
    work = sum(count for kind, count in operations.kinds.items() if kind not in host_cost.VIEWS)
    idle = sum(count for kind, count in operations.idle.items() if kind not in host_cost.VIEWS)
    assert timed.steps > 4 and operations.graphed  # the passes replayed their graphs
    assert work / timed.steps <= BUDGETS[name], dict(operations.kinds)
    waits, idle_work = WAITS[name]
    assert timed.waits >= timed.steps - 1 and timed.waits / timed.steps <= waits  # each step reads its choices
    assert idle / timed.steps <= idle_work, dict(operations.idle)
    assert not walks


@pytest.mark.parametrize("name", ["ar", "speculative", "medusa", "lookahead", "cllm"])
def test_the_tiny_mode_times_each_method_outside_the_graphs(host_cost, name):
    """`host_cost.py --tiny`: each method's configuration here, its steps timed outside the replays."""
    clock = host_cost.Clock()
    graphed, functions = host_cost.stand_ins(clock)
    operations = host_cost.Operations(clock)
    outside, steps, *_ = host_cost.measure_tiny(name, graphed, functions, clock, 32, (operations,))
    assert steps > 4 and outside > 0 and operations.graphed and sum(operations.kinds.values()) > 0
    cold = host_cost.Clock(evict=1 << 20)  # `--cold`: writes after each replay, which count as no operation
    graphed, functions = host_cost.stand_ins(cold)
    evicted = host_cost.Operations(cold)
    assert host_cost.measure_tiny(name, graphed, functions, cold, 32, (evicted,)).steps == steps
    assert evicted.kinds == operations.kinds and evicted.graphed == operations.graphed
