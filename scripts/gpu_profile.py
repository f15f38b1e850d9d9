"""Where a step's time goes on a GPU, for the prepared check (`scripts/gpu_check.sh`):
- for AR, speculative decoding, Medusa, lookahead and the CLLM, a step's time against the time the GPU is busy in it
  (torch.profiler's kernels and copies): what is left is the device waiting for the host; and the CUDA calls the
  host makes a step (kernel launches, graph replays, copies, waits for the device);
- what the host spends outside the target's pass (cProfile of one answer of --method, by function);
- which kernels an eager target pass of 1 and of 16 tokens runs (torch.profiler, by kernel);
- with --trace, a timeline of a short answer of --method (torch.profiler's Chrome trace, host and device), where the
  device's idle gaps in a step show which host work they wait for.

    python scripts/gpu_profile.py [--dtype bfloat16] [--method speculative] [--trace trace.json]
"""

import argparse
import cProfile
import io
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

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


def answer(target, name: str, tokens: int) -> Summary:
    """An answer of `name` with the device's set of defaults (`specdemo.defaults`), as the bench runs it."""
    options = {**method_options(name, target), **with_defaults(defaults_for(target.device), name, {})}
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


def busy(target, name: str, tokens: int) -> str:
    """One line: a step's time in an answer of `name`, and the time the GPU is busy a step in a
    second, profiled answer, with its kernels and copies as the profiler counts them."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    summary = answer(target, name, tokens)
    torch.cuda.synchronize()
    step_ms = 1000 * (time.perf_counter() - started) / summary.target_forwards
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        profiled = answer(target, name, tokens)
        torch.cuda.synchronize()
    rows = profiler.key_averages()
    device = [row for row in rows if row.device_type == torch.autograd.DeviceType.CUDA]
    busy_ms = sum(row.self_device_time_total for row in device) / 1000 / profiled.target_forwards
    kernels = sum(row.count for row in device) / profiled.target_forwards
    calls = {kind: sum(row.count for row in rows if row.key.startswith(prefixes)) / profiled.target_forwards
             for kind, prefixes in RUNTIME_CALLS.items()}
    return (f"{name}: a step {step_ms:.2f} ms; the GPU busy {busy_ms:.2f} ms of it ({kernels:.0f} kernels and copies), "
            f"waiting for the host {step_ms - busy_ms:.2f} ms; {len(summary.tokens) / summary.target_forwards:.2f} "
            "tokens a pass; the host a step: " + ", ".join(f"{count:.1f} {kind}" for kind, count in calls.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--method", default="speculative")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--trace", default=None, help="write a Chrome trace of a 24-token answer of --method here")
    args = parser.parse_args()
    target = load_model(dtype=args.dtype)
    target = compiled(target) if default_compile(target.device) else target  # graphs with CUDA, as the page runs
    answer(target, args.method, 16)  # loads and captures the companions' passes
    for name in ("ar", "speculative", "medusa", "lookahead", "cllm") if target.model.device.type == "cuda" else ():
        answer(target, name, 16)
        try:
            print(busy(target, name, args.tokens), flush=True)
        except Exception as error:  # noqa: BLE001 -- a profiler of another torch: the other tables still print
            print(f"{name}: the GPU's busy time could not be read: {type(error).__name__}: {error}", flush=True)
    if args.trace and target.model.device.type == "cuda":
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as traced:
            answer(target, args.method, 24)
            torch.cuda.synchronize()
        traced.export_chrome_trace(args.trace)
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
