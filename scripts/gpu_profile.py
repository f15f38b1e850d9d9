"""Where a step's time goes on a GPU, for the prepared check (`scripts/gpu_check.sh`):
- for AR, speculative decoding, Medusa (each also with its static tree), lookahead and the CLLM, a step's time
  against the time the GPU is busy in it (torch.profiler's kernels and copies): what is left is the device waiting
  for the host; and the CUDA calls the host makes a step (kernel launches, graph replays, copies, waits for the
  device);
- what the host spends outside the target's pass (cProfile of one answer of --method, by function);
- which kernels an eager target pass of 1 and of 16 tokens runs (torch.profiler, by kernel);
- with --trace, a timeline of a short answer of --method (torch.profiler's Chrome trace of the device's work, the
  host's CUDA calls and this project's Python frames), and from it the device's idle time a step by the host function
  it waited for (`idle_by_host`).

    python scripts/gpu_profile.py [--dtype bfloat16] [--method speculative] [--trace trace.json]
"""

import argparse
import bisect
import cProfile
import io
import json
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

from specdemo.core.errors import in_one_line
from specdemo.core.events import Summary, final_summary
from specdemo.core.kvcache import keep_prefix
from specdemo.core.static import default_compile, request_cache
from specdemo.core.verify import EMPTY, Proposal, target_pass
from specdemo.defaults import defaults_for, with_defaults
from specdemo.methods import get_method, method_options
from specdemo.models import compiled, load_model

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
# CUDA runtime calls the host makes, by what they cost it: a launch, a graph's replay, a copy, a wait for the device
RUNTIME_CALLS = {"kernel launches": ("cudaLaunchKernel", "cuLaunchKernel"), "graph replays": ("cudaGraphLaunch",),
                 "copies": ("cudaMemcpy",), "waits": ("cudaStreamSynchronize", "cudaDeviceSynchronize",
                                                     "cudaEventSynchronize")}
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # trace categories of what the device runs
KEPT = (*DEVICE_WORK, "cuda_runtime", "cuda_driver")  # what the written trace keeps, besides this project's frames
OURS = "specdemo/"  # how a Python frame of this project's code is named in a trace: specdemo/core/loop.py(119): decode


# the methods, and the static trees that the host reads once a step with the target's choices (docs/gpu.md)
BUSY = (("ar", {}), ("speculative", {}), ("speculative", {"static_tree": True, "gamma": 6, "draft_tree_size": 60}),
        ("medusa", {}), ("medusa", {"tree": "static", "tree_size": 57}), ("lookahead", {}), ("cllm", {}))


def answer(target, name: str, tokens: int, settings: dict | None = None) -> Summary:
    """An answer of `name` with the device's set of defaults (`specdemo.defaults`) and `settings`, as
    the bench runs it."""
    options = {**method_options(name, target), **with_defaults(defaults_for(target.device), name, settings or {})}
    events = get_method(name).generate(target.model, target.encode_chat(PROMPT), max_new_tokens=tokens,
                                       passes=target.passes, **options)
    return final_summary(events)


@torch.inference_mode()
def kernels(model, width: int, context: int = 256) -> str:
    """The CUDA kernels of one eager target pass of `width` tokens after `context` cached ones."""
    prompt = torch.zeros(1, context + 1, dtype=torch.long, device=model.device)
    cache = request_cache(model, context + width + 1)
    target_pass(model, cache, prompt[:, :context], EMPTY)
    chain = Proposal.chain([1] * (width - 1), "draft")
    for _ in range(3):
        target_pass(model, cache, prompt, chain)
        keep_prefix(cache, context)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        target_pass(model, cache, prompt, chain)
        torch.cuda.synchronize()
    return profiler.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60)


def busy(target, name: str, tokens: int, settings: dict | None = None) -> str:
    """One line: a step's time in an answer of `name` (with `settings`), and the time the GPU is busy
    a step in a second, profiled answer, with its kernels and copies as the profiler counts them."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    summary = answer(target, name, tokens, settings)
    torch.cuda.synchronize()
    step_ms = 1000 * (time.perf_counter() - started) / summary.target_forwards
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        profiled = answer(target, name, tokens, settings)
        torch.cuda.synchronize()
    rows = profiler.key_averages()
    device = [row for row in rows if row.device_type == torch.autograd.DeviceType.CUDA]
    busy_ms = sum(row.self_device_time_total for row in device) / 1000 / profiled.target_forwards
    kernels = sum(row.count for row in device) / profiled.target_forwards
    calls = {kind: sum(row.count for row in rows if row.key.startswith(prefixes)) / profiled.target_forwards
             for kind, prefixes in RUNTIME_CALLS.items()}
    label = " ".join([name, *(f"{key}={value}" for key, value in (settings or {}).items())])
    return (f"{label}: a step {step_ms:.2f} ms; the GPU busy {busy_ms:.2f} ms of it ({kernels:.0f} kernels and "
            f"copies), waiting for the host {step_ms - busy_ms:.2f} ms; "
            f"{len(summary.tokens) / summary.target_forwards:.2f} tokens a pass; the host a step: "
            + ", ".join(f"{count:.1f} {kind}" for kind, count in calls.items()))


def idle_by_host(events: list[dict], steps: int, top: int = 12) -> str:
    """Where the device waited for the host in a traced answer of `steps` target passes (torch.profiler's
    Chrome trace events, made `with_stack`): the device's idle time between its first and last work,
    a step, by the innermost function of this project the host was in meanwhile (the host's time in
    any other code is its caller's). The Python tracer slows the host, so a traced gap is wider than an
    untraced one; which functions the gaps wait for is what this tells."""
    work = sorted((event["ts"], event["ts"] + event["dur"]) for event in events
                  if event.get("ph") == "X" and event.get("cat") in DEVICE_WORK)
    idle, end = [], None
    for start, stop in work:
        if end is not None and start > end:
            idle.append((end, start))
        end = stop if end is None else max(end, stop)
    ours = [event for event in events
            if event.get("ph") == "X" and event.get("cat") == "python_function" and OURS in event["name"]]
    threads = [event.get("tid") for event in ours]
    host = max(set(threads), key=threads.count) if threads else None  # the thread that runs the answer
    frames = [(event["ts"], event["ts"] + event["dur"], event["name"][event["name"].index(OURS):]) for event in ours
              if event.get("tid") == host]
    by_function: dict[str, float] = {}
    for start, stop, name in overlaps(idle, innermost(frames)):
        by_function[name] = by_function.get(name, 0.0) + stop - start
    total = sum(stop - start for start, stop in idle)
    rows = sorted(by_function.items(), key=lambda item: -item[1])[:top]
    return "\n".join([f"the device idle {total / 1000 / steps:.3f} ms a step (traced), while the host was in:",
                      *(f"{micros / 1000 / steps:8.3f} ms  {name}" for name, micros in rows)])


def innermost(frames: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The host's time as spans (start, end, name) of the innermost of `frames` (nested spans
    (start, end, name) of one thread) running then; "(none)" between them."""
    spans, stack, now = [], [], float("-inf")
    for start, stop, name in sorted(frames, key=lambda frame: (frame[0], -frame[1])):
        while stack and stack[-1][0] <= start:  # the frames that ended before this one began
            ended, top = stack.pop()
            spans.append((now, ended, top))
            now = ended
        spans.append((now, start, stack[-1][1] if stack else "(none)"))
        stack.append((stop, name))
        now = start
    while stack:
        ended, top = stack.pop()
        spans.append((now, ended, top))
        now = ended
    spans.append((now, float("inf"), "(none)"))
    return [span for span in spans if span[1] > span[0]]


def overlaps(idle: list[tuple[float, float]], spans: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The parts of `idle` (sorted, disjoint intervals) within each of `spans` (sorted, disjoint, covering them)."""
    starts = [span[0] for span in spans]
    parts = []
    for start, stop in idle:
        at = max(bisect.bisect_right(starts, start) - 1, 0)
        while at < len(spans) and spans[at][0] < stop:
            low, high = max(start, spans[at][0]), min(stop, spans[at][1])
            if high > low:
                parts.append((low, high, spans[at][2]))
            at += 1
    return parts


def traced(target, name: str, tokens: int, path: str) -> str:
    """`idle_by_host` of an answer of `name`, whose trace is written to `path`: the device's work,
    the host's CUDA calls and this project's Python frames (all of a trace would be tens of MB)."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as profiler:
        summary = answer(target, name, tokens)
        torch.cuda.synchronize()
    profiler.export_chrome_trace(path)
    with open(path) as file:
        trace = json.load(file)
    trace["traceEvents"] = [event for event in trace["traceEvents"] if event.get("ph") != "X"
                            or event.get("cat") in KEPT or OURS in event.get("name", "")]
    with open(path, "w") as file:
        json.dump(trace, file)
    return idle_by_host(trace["traceEvents"], summary.target_forwards)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--method", default="speculative")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--trace", default=None, help="write a Chrome trace of a 48-token answer of --method here")
    args = parser.parse_args()
    target = load_model(dtype=args.dtype)
    target = compiled(target) if default_compile(target.device) else target  # graphs with CUDA, as the page runs
    answer(target, args.method, 16)  # loads and captures the companions' passes
    for name, settings in BUSY if target.model.device.type == "cuda" else ():
        try:
            answer(target, name, 16, settings)
            print(busy(target, name, args.tokens, settings), flush=True)
        except Exception as error:  # noqa: BLE001 -- one method's fault, or a profiler of another torch: the rest prints
            print(f"{name}: the GPU's busy time not measured: {in_one_line(error)}", flush=True)
    if args.trace and target.model.device.type == "cuda":
        print(f"{args.method}, a traced answer of 48 tokens: {traced(target, args.method, 48, args.trace)}", flush=True)
    profiler = cProfile.Profile()
    profiler.enable()
    summary = answer(target, args.method, args.tokens)
    profiler.disable()
    print(f"{args.method}: {len(summary.tokens)} tokens in {summary.target_forwards} target passes")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(28)
    print(out.getvalue()[-9000:])
    for width in (1, 16) if target.model.device.type == "cuda" else ():
        print(f"eager target pass of {width} token(s), kernels by GPU time:")
        print(kernels(target.model, width))


if __name__ == "__main__":
    main()
