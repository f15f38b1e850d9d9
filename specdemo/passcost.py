"""`python -m specdemo.passcost`: what one target pass costs by how many tokens it feeds.

Every verifying method rests on one fact: checking several tokens in one pass costs about what
producing one does. Where that holds (a launch-bound GPU pass, weights streamed from far away)
wide proposals are nearly free; where each fed token costs compute (a small CPU) they are not.
This measures it: a pass of w tokens after `--context` cached positions, the median of
`--repeats` timed passes after warm-ups, on the eager path; with `--graphs`, on the compiled
static path too (CUDA graphs with CUDA, `static.compile_passes`), with `--windowed` that path
again attending over the window of the graphs' buffer that holds the pass rather than the whole
buffer (`graphs.GRAPH_WINDOWS`), and with `--sdpa` again with transformers' SDPA in place of
grouped attention (`core.grouped_attention`, which the loaded model runs); with `--offloaded`,
on the same model with every decoder layer offloaded to disk (`placement`, the weights streamed
in at every pass).

    python -m specdemo.passcost --dtype float32 --widths 1,4,8,16,32 --json out.json
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specdemo.core.graphs import GRAPH_WINDOWS
from specdemo.core.kvcache import keep_prefix
from specdemo.core.static import CompiledPass, compile_passes, request_cache
from specdemo.core.verify import EMPTY, Proposal, target_pass
from specdemo.models import AUTO, EMBEDDED, load_model

WIDTHS = (1, 2, 4, 8, 16, 32, 64)


def seconds_since(start: float, device: torch.device) -> float:
    """Seconds since `start` (`time.perf_counter`) once `device` has done the work queued on it:
    a CUDA pass returns before it runs."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


@torch.inference_mode()
def pass_costs(model, widths=WIDTHS, context: int = 256, repeats: int = 20,
               passes: CompiledPass | None = None) -> dict[int, float]:
    """Milliseconds of one target pass feeding w tokens after `context` cached ones, by width:
    the median of `repeats` passes after three warm-ups, each rolled back after it (as a rejected
    proposal is). The widths take turns, in alternating order, so a drift in the machine's speed
    moves every width alike. `passes`: the model's compiled static pass (None: eager)."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, model.config.vocab_size, (1, context + 1), generator=generator).to(model.device)
    cache = request_cache(model, context + max(widths) + 1, passes)
    target_pass(model, cache, prompt[:, :context], EMPTY)
    proposals = {width: Proposal.chain([1] * (width - 1), "draft") for width in widths}
    times = {width: [] for width in widths}
    for attempt in range(3 + repeats):
        for width in widths if attempt % 2 == 0 else reversed(widths):
            started = time.perf_counter()
            target_pass(model, cache, prompt, proposals[width])
            elapsed = seconds_since(started, model.device)
            keep_prefix(cache, context)
            if attempt >= 3:
                times[width].append(elapsed * 1000)
    costs = {width: statistics.median(times[width]) for width in widths}
    return costs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=EMBEDDED)
    parser.add_argument("--dtype", default=AUTO)
    parser.add_argument("--device", default=None)
    parser.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--graphs", action="store_true",
                        help="also measure the compiled static pass (CUDA graphs with CUDA)")
    parser.add_argument("--windowed", action="store_true",
                        help="with --graphs, the compiled pass again over a window of the graphs' buffer")
    parser.add_argument("--sdpa", action="store_true",
                        help="with --graphs, the compiled pass again with transformers' SDPA, not grouped attention")
    parser.add_argument("--offloaded", action="store_true",
                        help="also measure the model with every decoder layer offloaded to disk")
    parser.add_argument("--offload-folder", type=Path, default=None, help="where --offloaded writes the layers")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    target = load_model(args.model, dtype=args.dtype, device=args.device)
    widths = tuple(int(width) for width in args.widths.split(","))
    report = {"model": target.source, "device": device_name(target.device),
              "dtype": str(target.dtype).removeprefix("torch."), "torch": torch.__version__, "context": args.context}

    def measured(kind: str, model: torch.nn.Module, passes: CompiledPass | None = None) -> None:
        """`kind`'s costs, printed and written once measured: a run stopped later keeps them. Where
        its graphs failed (the passes then ran eagerly), why, in place of its costs."""
        costs = pass_costs(model, widths, args.context, args.repeats, passes)
        if passes is not None and passes.failed:
            report.setdefault("failed", {})[kind] = passes.failed.splitlines()[0]
            print(f"{kind}: not measured, its graphs failed: {report['failed'][kind]}", flush=True)
        else:
            report[kind] = costs
            print(f"{kind}: " + ", ".join(f"{width} {ms:.2f} ms" for width, ms in costs.items()), flush=True)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))

    measured("eager", target.model)
    if args.graphs:
        def progress(message: str) -> None:
            print(message, file=sys.stderr, flush=True)

        measured("graphed", target.model, compile_passes(target.model, progress=progress))
        if args.windowed:
            measured("graphed-window", target.model,
                     compile_passes(target.model, progress=progress, windows=GRAPH_WINDOWS))
        if args.sdpa:  # the alternative, for a choice by measurement; this process's model is not used after it
            target.model.set_attn_implementation("sdpa")
            measured("graphed-sdpa", target.model, compile_passes(target.model, progress=progress))
    if args.offloaded:
        measured("offloaded", load_model(args.model, args.dtype, args.device, device_map="disk",
                                         offload_folder=args.offload_folder).model)
    print(format_table(report))
    return report


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def format_table(report: dict) -> str:
    kinds = [kind for kind in ("eager", "graphed", "graphed-window", "graphed-sdpa", "offloaded") if kind in report]
    lines = [f"pass cost by width: {report['device']}, {report['dtype']}, torch {report['torch']}, after "
             f"{report['context']} cached positions",
             "| tokens fed | " + " | ".join(f"{kind} ms | {kind} vs 1 token" for kind in kinds) + " |",
             "| --- |" + " --- | --- |" * len(kinds)]
    for width in report["eager"]:
        cells = [f"{report[kind][width]:.2f} | {report[kind][width] / report[kind][min(report[kind])]:.2f}x"
                 for kind in kinds]
        lines.append(f"| {width} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
