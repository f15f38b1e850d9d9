"""The host's share of a step on the CUDA-graph path, measured on a CPU. On a GPU a small model's
step outside the target's pass is host work: Python, and one launch per torch operation outside a
graph. Here every graph of the target, the draft (a static tree's levels too), the CLLM and Medusa's
heads runs through the replaying stand-ins of tests/test_graphs.py, and for each method this
prints the time a step outside the replays, the part of it that runs torch operations (the rest is
Python and torch's dispatch, which a GPU's host pays as well), and the torch operations a step
outside them (the prompt's pass is no step's work): all, then those that do more than make a view
(on a GPU, a launch each where they act on its tensors), by kind; and the operations inside the
replays, besides views and casts (a reshape or `contiguous` counts where it copies): the kernels a
step's graphs hold on a GPU, where each costs a few microseconds whatever it computes (AR's: one
target pass).

    PYTHONPATH=. python scripts/host_cost.py [--methods ar,speculative,medusa] [--dtype bfloat16] \
        [--set speculative.static_tree=true ...] [--tiny [--cold]]

The operations do not depend on the machine. The time does, and on a CPU it also holds the eager
products (a draft's logits, the target's argmax) that a GPU runs in microseconds, and the Python
after a replay runs in caches the replay evicted, so compare it only between runs on one machine.
Trees are sized as on a CPU (`static.fitted_size`). `--tiny` runs each method as
tests/test_conformance.py configures it, on its tiny random models, where neither holds: its time
is Python and dispatch, the part of a step a GPU's host pays whatever the model; with `--cold`
each replay then writes 256 MB, as the embedded model's replays evict a CPU's caches.
"""

import argparse
import contextlib
import functools
import sys
import time
from collections import Counter
from pathlib import Path

import numpy
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_conformance import configurations  # noqa: E402
from test_graphs import ReplayedFunctionGraphs, ReplayedGraphs  # noqa: E402

from specdemo.bench import parse_settings  # noqa: E402
from specdemo.core.events import final_summary  # noqa: E402
from specdemo.core.static import BUCKETS, DRAFT_BUCKETS, CompiledPass, joined_forward, warm_up  # noqa: E402
from specdemo.methods import get_method, method_options  # noqa: E402
from specdemo.models import load_model  # noqa: E402

from conftest import make_tiny_model  # noqa: E402

# operations that only make a view, or read a tensor on the host: no kernel a GPU runs
VIEWS = frozenset({"alias", "as_strided", "chunk", "detach", "detach_", "expand", "lift_fresh", "permute",
                   "resolve_conj", "resolve_neg", "select", "slice", "split", "split_with_sizes", "squeeze", "t",
                   "transpose", "unbind", "unfold", "unsqueeze", "view", "_unsafe_view"})
MAYBE_COPIES = frozenset({"reshape", "contiguous"})  # a copy where the input's layout allows no view: counted then
# with --tiny: each method's configuration in tests/test_conformance.py, and its prompt
TINY = {"ar": "ar", "speculative": "speculative, feature draft, tree", "medusa": "medusa, dynamic tree",
        "lookahead": "lookahead", "cllm": "cllm, lookahead"}
TINY_PROMPT = torch.tensor([[5, 17, 42, 8, 63, 21]])
PROMPTS = ("Write a short story about a lighthouse keeper who finds a message in a bottle.",
           "Explain how a refrigerator works, step by step, for a ten-year-old.")


class Clock:
    """Seconds spent inside replays, and whether one runs now. `evict`: bytes each replay then
    writes (numpy's, no torch operation), as a model's replays on a CPU evict its caches."""

    def __init__(self, evict: int = 0):
        self.inside, self.replaying = 0.0, False
        self.evicting = numpy.zeros(evict // 8) if evict else None

    def timed(self, replay):
        """`replay`, its time and operations not the host's (a capture too: once, not a step's)."""
        def run(*args):
            self.replaying, started = True, time.perf_counter()
            try:
                return replay(*args)
            finally:
                if self.evicting is not None:
                    self.evicting += 1
                self.inside += time.perf_counter() - started
                self.replaying = False
        return run


class Operations(TorchDispatchMode):
    """Counts torch operations by kind, outside replays (`kinds`) and inside them (`graphed`), and
    the seconds the former take to run (`seconds`; this mode's own bookkeeping is not in them)."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock, self.kinds, self.graphed, self.seconds = clock, Counter(), Counter(), 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        started = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        ran = time.perf_counter() - started
        kind = func.overloadpacket.__name__
        if kind in MAYBE_COPIES:
            kind = f"{kind} (a copy)" if out.data_ptr() != args[0].data_ptr() else "view"
        if self.clock.replaying:
            self.graphed[kind] += 1
        else:
            self.kinds[kind] += 1
            self.seconds += ran
        return out


def stand_ins(clock: Clock):
    """The replaying graphs, their replays timed by `clock`."""

    class Functions(ReplayedFunctionGraphs):
        def capture(self, function, inputs):
            captured = clock.timed(super().capture)(function, inputs)
            captured.graph.replay = clock.timed(captured.graph.replay)
            return captured

    class Graphs(ReplayedGraphs):
        def __init__(self, *args):
            super().__init__(*args)
            self.functions = Functions()  # a static draft tree's levels

        def capture(self, *args):
            graph = clock.timed(super().capture)(*args)
            graph.graph.replay = clock.timed(graph.graph.replay)
            return graph

    def graphed(model, buckets, role):
        # as `static.compile_passes` with CUDA: the decoder's products joined
        passes = CompiledPass(joined_forward(model.get_decoder(), 1 << 40), buckets, "cuda-graphs",
                              graphs=Graphs(model, 4096))
        warm_up(model, passes, None, role)
        return passes

    return graphed, Functions


def graphed_companions(options: dict, model, graphed, functions) -> dict:
    """The graphed passes of `model` and of the companions in a method's `options`, as
    `static.compile_passes` gives them with CUDA (a CLLM's model is `model` here)."""
    given = {"passes": graphed(model, BUCKETS, "target")}
    if "draft" in options:
        given["draft_passes"] = graphed(options["draft"].model, DRAFT_BUCKETS, "draft")
    if "cllm_model" in options:
        given["cllm_passes"] = given["passes"]
    if "heads" in options:
        given["heads_passes"] = functions()
    return given


def timed_answer(events, clock: Clock, ops: Operations | None) -> tuple[float, int]:
    """(seconds outside replays, steps) of one answer's `events`; the prompt's pass (eager where it
    is wider than every bucket) is no step's work and counts in neither."""
    first = next(events)
    clock.inside, started = 0.0, time.perf_counter()
    with ops or contextlib.nullcontext():
        rest = list(events)
    return time.perf_counter() - started - clock.inside, final_summary([first, *rest]).target_forwards - 1


def measure(target, name: str, passes, graphed, functions, clock: Clock, tokens: int, ops: Operations | None,
            settings: dict | None = None):
    """(seconds outside replays, steps) of `name` answering PROMPTS with `settings`."""
    options = dict(method_options(name, target)) | (settings or {})
    if options.get("draft_passes") is None and "draft" in options:
        options["draft_passes"] = graphed(options["draft"].model, DRAFT_BUCKETS, "draft")
    if "cllm_model" in options:
        options["cllm_passes"] = graphed(options["cllm_model"], BUCKETS, "target")
    if "heads" in options:
        options["heads_passes"] = functions()
    answers = [timed_answer(get_method(name).generate(target.model, target.encode_chat(prompt),
                                                      max_new_tokens=tokens, passes=passes, **options), clock, ops)
               for prompt in PROMPTS]
    return sum(outside for outside, _ in answers), sum(steps for _, steps in answers)


def measure_tiny(name: str, graphed, functions, clock: Clock, tokens: int, ops: Operations | None):
    """(seconds outside replays, steps) of `name` in `tests/test_conformance.py`'s configuration
    (TINY) on its tiny random models, whose operations cost microseconds: the time is Python and
    torch's dispatch, what a GPU's host pays, without the embedded model's eager products and the
    caches its replays evict. Its trees take the tests' settings, and it retrieves from no datastore."""
    target = make_tiny_model()
    generate, options, model = configurations(target, make_tiny_model(seed=1))[TINY[name]]
    answer = functools.partial(generate, model, TINY_PROMPT, max_new_tokens=tokens, eos_token_ids=(), **options,
                               **graphed_companions(options, model, graphed, functions))
    list(answer())  # the first answer captures what its first use does (a tree's look-back passes)
    return timed_answer(answer(), clock, ops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="ar,speculative,medusa,lookahead,cllm")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--set", action="append", default=[], metavar="METHOD.SETTING=VALUE",
                        help="a method's setting, as the bench takes it")
    parser.add_argument("--tiny", action="store_true",
                        help="the tests' tiny random models: Python and dispatch, not the embedded model's products")
    parser.add_argument("--cold", action="store_true",
                        help="each replay then writes 256 MB, as the embedded model's evict a CPU's caches")
    args = parser.parse_args()
    methods = args.methods.split(",")
    settings = parse_settings(args.set, methods)
    if args.tiny and args.set:
        parser.error("--set takes the embedded model's settings; --tiny runs the tests' configurations")
    clock = Clock(256 << 20 if args.cold else 0)
    graphed, functions = stand_ins(clock)
    if args.tiny:
        runs = {name: functools.partial(measure_tiny, name, graphed, functions, clock) for name in methods}
    else:
        target = load_model(dtype=args.dtype)
        passes = graphed(target.model, BUCKETS, "target")
        runs = {name: functools.partial(measure, target, name, passes, graphed, functions, clock,
                                        settings=settings[name]) for name in methods}
    for name, run in runs.items():
        run(16, None)  # loads the companions, captures
        outside, steps = run(args.tokens, None)
        ops = Operations(clock)
        _, counted = run(args.tokens, ops)
        work = Counter({kind: count for kind, count in ops.kinds.items() if kind not in VIEWS})
        kinds = ", ".join(f"{kind} {count / counted:.1f}" for kind, count in work.most_common(8))
        kernels = sum(count for kind, count in ops.graphed.items() if kind not in VIEWS | {"to"})
        print(f"{name}: {1000 * outside / steps:.2f} ms a step outside the replays, "
              f"{1000 * ops.seconds / counted:.2f} ms of it running torch operations; "
              f"torch operations a step outside them {sum(ops.kinds.values()) / counted:.1f}, "
              f"{sum(work.values()) / counted:.1f} besides views "
              f"({kinds}, ...); inside them {kernels / counted:.1f} besides views and casts", flush=True)


if __name__ == "__main__":
    main()
