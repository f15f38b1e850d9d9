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
target pass); and the step's waits for the device (a read of a tensor's values after a replay), how
long the host then works until it queues the next graph, and the operations it runs meanwhile: on a
GPU the device idles that long, however fast it is (each eager operation a kernel of microseconds).

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
from typing import NamedTuple

import numpy
import torch
from torch.overrides import TorchFunctionMode
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

# a read of a tensor's values on the host: with CUDA it waits for what the device was given
READS = frozenset({"tolist", "item", "numpy", "cpu", "__bool__", "__int__", "__index__", "__float__"})
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
    writes (numpy's, no torch operation), as a model's replays on a CPU evict its caches. Under
    `Waits` it also adds up the host's waits for the device: a read of a tensor's values after a
    replay waits with CUDA until the device has run it, and the device then idles until the next
    replay (`idle`, seconds; `waits`, how many)."""

    def __init__(self, evict: int = 0):
        self.inside, self.replaying = 0.0, False
        self.evicting = numpy.zeros(evict // 8) if evict else None
        self.restart()

    def restart(self) -> None:
        """Count from here: no time inside replays, no wait, nothing queued."""
        self.inside, self.idle, self.waits, self.idle_since, self.queued = 0.0, 0.0, 0, None, False

    def read(self) -> None:
        """The host read a tensor's values: a wait, where a replay came since the last."""
        if self.queued:
            self.queued, self.waits, self.idle_since = False, self.waits + 1, time.perf_counter()

    def timed(self, replay):
        """`replay`, its time and operations not the host's (a capture too: once, not a step's)."""
        def run(*args):
            self.replaying, started = True, time.perf_counter()
            if self.idle_since is not None:
                self.idle, self.idle_since = self.idle + started - self.idle_since, None
            try:
                return replay(*args)
            finally:
                if self.evicting is not None:
                    self.evicting += 1
                self.inside += time.perf_counter() - started
                self.replaying, self.queued = False, True
        return run


class Waits(TorchFunctionMode):
    """Tells `clock` of each read of a tensor's values on the host outside replays (READS)."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock = clock

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in READS and not self.clock.replaying:
            self.clock.read()
        return func(*args, **(kwargs or {}))


class Operations(TorchDispatchMode):
    """Counts torch operations by kind, outside replays (`kinds`) and inside them (`graphed`), and
    the seconds the former take to run (`seconds`; this mode's own bookkeeping is not in them);
    under `Waits`, those outside run while the device idles too (`idle`)."""

    def __init__(self, clock: Clock):
        super().__init__()
        self.clock, self.kinds, self.graphed, self.idle, self.seconds = clock, Counter(), Counter(), Counter(), 0.0

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
            self.idle[kind] += self.clock.idle_since is not None
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


class Timed(NamedTuple):
    """What answers took outside the replays: seconds, the steps they took, and under `Waits` the
    seconds the device idled while the host worked after a wait, and the waits."""

    outside: float
    steps: int
    idle: float = 0.0
    waits: int = 0


def timed_answer(events, clock: Clock, modes: tuple = ()) -> Timed:
    """One answer's `events`, run under `modes` (`Operations`, `Waits`); the prompt's pass (eager where it
    is wider than every bucket) is no step's work and counts in nothing."""
    first = next(events)
    clock.restart()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        for mode in modes:
            stack.enter_context(mode)
        rest = list(events)
    outside = time.perf_counter() - started - clock.inside
    return Timed(outside, final_summary([first, *rest]).target_forwards - 1, clock.idle, clock.waits)


def measure(target, name: str, passes, graphed, functions, clock: Clock, tokens: int, modes: tuple = (),
            settings: dict | None = None):
    """What `name` took answering PROMPTS with `settings` (`Timed`, summed)."""
    options = dict(method_options(name, target)) | (settings or {})
    if options.get("draft_passes") is None and "draft" in options:
        options["draft_passes"] = graphed(options["draft"].model, DRAFT_BUCKETS, "draft")
    if "cllm_model" in options:
        options["cllm_passes"] = graphed(options["cllm_model"], BUCKETS, "target")
    if "heads" in options:
        options["heads_passes"] = functions()
    answers = [timed_answer(get_method(name).generate(target.model, target.encode_chat(prompt),
                                                      max_new_tokens=tokens, passes=passes, **options), clock, modes)
               for prompt in PROMPTS]
    return Timed(*map(sum, zip(*answers)))


def measure_tiny(name: str, graphed, functions, clock: Clock, tokens: int, modes: tuple = ()):
    """What `name` took (`Timed`) in `tests/test_conformance.py`'s configuration
    (TINY) on its tiny random models, whose operations cost microseconds: the time is Python and
    torch's dispatch, what a GPU's host pays, without the embedded model's eager products and the
    caches its replays evict. Its trees take the tests' settings, and it retrieves from no datastore."""
    target = make_tiny_model()
    generate, options, model = configurations(target, make_tiny_model(seed=1))[TINY[name]]
    answer = functools.partial(generate, model, TINY_PROMPT, max_new_tokens=tokens, eos_token_ids=(), **options,
                               **graphed_companions(options, model, graphed, functions))
    list(answer())  # the first answer captures what its first use does (a tree's look-back passes)
    return timed_answer(answer(), clock, modes)


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
        run(16)  # loads the companions, captures
        timed = run(args.tokens)
        waited = run(args.tokens, (Waits(clock),))  # a run of its own: the mode slows every torch call a little
        ops = Operations(clock)
        counted = run(args.tokens, (ops, Waits(clock))).steps
        work = Counter({kind: count for kind, count in ops.kinds.items() if kind not in VIEWS})
        kinds = ", ".join(f"{kind} {count / counted:.1f}" for kind, count in work.most_common(8))
        kernels = sum(count for kind, count in ops.graphed.items() if kind not in VIEWS | {"to"})
        idle = sum(count for kind, count in ops.idle.items() if kind not in VIEWS)
        print(f"{name}: {1000 * timed.outside / timed.steps:.2f} ms a step outside the replays, "
              f"{1000 * ops.seconds / counted:.2f} ms of it running torch operations; "
              f"torch operations a step outside them {sum(ops.kinds.values()) / counted:.1f}, "
              f"{sum(work.values()) / counted:.1f} besides views "
              f"({kinds}, ...); inside them {kernels / counted:.1f} besides views and casts; "
              f"{waited.waits / waited.steps:.1f} waits a step, then the device idles "
              f"{1000 * waited.idle / waited.steps:.2f} ms a step (of {1000 * waited.outside / waited.steps:.2f} "
              f"outside the replays in that run) while the host runs {idle / counted:.1f} operations "
              f"besides views", flush=True)


if __name__ == "__main__":
    main()
