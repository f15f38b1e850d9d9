"""ZeroGPU's ahead-of-time route for the target's pass, measured beside the route the app takes.

Each ZeroGPU call is a fresh process, where nothing an earlier call compiled or captured survives
(docs/hosting.md). Two routes give its passes few launches: capture CUDA graphs at the call's
start, which the app does and counts in the call's declared duration (`clicks.ready`;
`scripts/setup_cost.py` times it), or compile the pass ahead of time once (`torch.export`, then
AOTInductor, which `spaces.aoti_compile` wraps) and load the compiled package in every call. This
measures the second for the embedded target's pass at each width given (a padded bucket), after
`--context` cached positions:

- exporting and compiling, once (on a Space, at its start), the weights kept apart as ZeroGPU
  keeps them;
- loading the package's kernels in a fresh process, as every call would, and handing it the
  loaded model's weights;
- one pass, the median of `--repeats` after warm-ups: eager; captured by hand into a CUDA graph
  (the app's route, CUDA only); the compiled package; the compiled package captured into a CUDA
  graph (CUDA only: a package launches each of its kernels from C++, a graph replays them with
  one launch). Each way's logits are checked against the eager pass's: their largest gap, and
  whether every fed token's top token is the same (in bfloat16 a compiled pass rounds elsewhere).

    PYTHONPATH=. python scripts/aot_cost.py [--dtype bfloat16] [--widths 1,16] [--repeats 20] [--json OUT]

On a CPU it checks the route and times it; the CUDA rows wait for a GPU.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch
from torch._inductor.package.package import package_aoti

from specdemo.core import llama
from specdemo.core.errors import in_one_line
from specdemo.core.graphs import padded_inputs, recorded, replayable
from specdemo.core.kvcache import StaticKV
from specdemo.core.static import JOINED_SHARE, capacity, joined_forward, padded_layout, static_forward
from specdemo.models import load_model

# ZeroGPU's settings for a package (`spaces.aoti_compile`): the weights stay out of the compiled code, and a call
# hands it the tensors of the model it loaded at the Space's start (`loaded`)
APART = {"aot_inductor.package_constants_in_so": False, "aot_inductor.package": True,
         "always_keep_tensor_constants": True, "joint_graph_constant_folding": False,
         "aot_inductor.package_constants_on_disk_format": "pickle_weights"}
# a fresh process loading a package's kernels, with torch and its compiler imported first, as a ZeroGPU call forked
# from the Space's process has them: the seconds it prints are the load's alone
LOAD = ("import sys, time, torch, torch._inductor.package; started = time.perf_counter(); "
        "torch._inductor.aoti_load_package(sys.argv[1]); print(time.perf_counter() - started)")


class ExportedPass(torch.nn.Module):
    """The target's static pass of one padded width (`static.static_forward`, its products joined
    where CUDA graphs join them) as a module `torch.export` traces: the fed inputs, the layout
    (`static.padded_layout`'s bytes) and the KV buffer (`StaticKV.buffer`, which it writes) are its
    inputs; it returns the hidden states and the logits. `room`: the bytes the joined products may
    take (None: as `static.compile_passes` gives them, with CUDA only)."""

    def __init__(self, model, bucket: int, positions: int, room: int | None = None):
        super().__init__()
        self.model, self.bucket, self.positions = model, bucket, positions
        decoder = model.get_decoder()
        if room is None:
            room = torch.cuda.mem_get_info(model.device)[0] // JOINED_SHARE if model.device.type == "cuda" else 0
        self.run = joined_forward(decoder, room) if room else static_forward
        self.register_buffer("rotary", llama.rotary_table(decoder, positions), persistent=False)

    def forward(self, inputs: torch.Tensor, layout: torch.Tensor, buffer: torch.Tensor):
        cache = StaticKV(self.model, self.positions, rotary=self.rotary, buffer=buffer)
        return replayable(self.run, self.model.get_decoder(), cache, inputs, layout, self.bucket,
                          self.model.get_output_embeddings(), ())()  # the pass a CUDA graph records


def pass_inputs(model, width: int, context: int, positions: int) -> tuple[torch.Tensor, ...]:
    """A pass of `width` tokens (a chain) after `context` cached positions: its inputs, its layout
    and a KV buffer of `positions`, on the model's device."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, model.config.vocab_size, (1, width), generator=generator)
    layout = padded_layout(np.arange(context, context + width), np.tri(width, dtype=bool), width, 0, context)
    buffer = StaticKV(model, positions).buffer
    return padded_inputs(tokens, width).to(model.device), layout.to(model.device), buffer


def milliseconds(run, device: torch.device, repeats: int) -> float:
    """The median milliseconds of `run()` over `repeats` calls after three, each to the device's last work."""
    times = []
    for attempt in range(3 + repeats):
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if attempt >= 3:
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def seconds(run) -> tuple[object, float]:
    """run()'s value and the seconds it took on the host (compiling and loading are the host's work)."""
    started = time.perf_counter()
    value = run()
    return value, time.perf_counter() - started


def compiled_apart(program: torch.export.ExportedProgram, package: str) -> dict[str, torch.Tensor]:
    """`program` compiled ahead of time into `package` with its weights kept apart (`APART`), and those weights."""
    args, kwargs = program.example_inputs
    artifacts = torch._inductor.aot_compile(program.module(), args, kwargs, options=APART)
    package_aoti(package, [artifact for artifact in artifacts if isinstance(artifact, str)])
    weights = next(artifact for artifact in artifacts if not isinstance(artifact, str))
    return {name: weights.get_weight(name)[0] for name in weights}


def loaded(package: str, weights: dict[str, torch.Tensor]):
    """The package's model given `weights` as they are, no copy (as a ZeroGPU call gives its model's)."""
    model = torch._inductor.aoti_load_package(package)
    model.load_constants({name: weights[name] for name in model.get_constant_fqns()}, check_full_update=True,
                         user_managed=True)
    return model


def measure_width(model, width: int, context: int, repeats: int, folder: Path, room: int | None = None) -> dict:
    """One width's row: the route's one-time costs, a fresh process's load, each way's pass and its
    logits' gap (`room`: `ExportedPass`')."""
    device = model.device
    module = ExportedPass(model, width, capacity(model, context + width), room)
    inputs, layout, buffer = pass_inputs(model, width, context, module.positions)
    row = {"width": width}
    with torch.inference_mode():
        reference = module(inputs, layout, buffer)[1]
    program, row["export_s"] = seconds(lambda: torch.export.export(module, (inputs, layout, buffer)))
    package = str(folder / f"pass-{width}.pt2")
    weights, row["compile_s"] = seconds(lambda: compiled_apart(program, package))
    row["package_mb"] = round(Path(package).stat().st_size / 2**20, 1)
    fresh = subprocess.run([sys.executable, "-c", LOAD, package], capture_output=True, text=True, check=True)
    row["fresh_load_s"] = float(fresh.stdout.split()[-1])
    compiled, row["load_s"] = seconds(lambda: loaded(package, weights))
    ways = {"eager": lambda: module(inputs, layout, buffer), "ahead of time": lambda: compiled(inputs, layout, buffer)}
    with torch.inference_mode():  # uncaptured first: a capture may leave a package unfit to run uncaptured after
        for name, run in ways.items():
            measure_way(row, name, run, reference, device, repeats)
        for name, run in list(ways.items()) if device.type == "cuda" else ():
            try:  # a capture that fails is a finding: told, and the rest goes on
                graph, out = recorded(run, device, torch.cuda.graph_pool_handle())
            except Exception as error:  # noqa: BLE001
                row[f"{name}, graphed"] = in_one_line(error)
                continue
            measure_way(row, f"{name}, graphed", lambda graph=graph, out=out: (graph.replay(), out)[1], reference,
                        device, repeats)
    return row


def measure_way(row: dict, name: str, run, reference: torch.Tensor, device: torch.device, repeats: int) -> None:
    """Into `row`: how far `run()`'s logits lie from the eager pass's `reference`, whether every fed
    token's top token is the same, and its milliseconds; or, where it fails, why (the other ways go on)."""
    try:
        logits = run()[1]
        row[f"{name} gap"] = float((logits - reference).abs().max())
        row[f"{name} same top tokens"] = bool((logits.argmax(-1) == reference.argmax(-1)).all())
        row[f"{name} ms"] = round(milliseconds(run, device, repeats), 3)
    except Exception as error:  # noqa: BLE001 -- told in the row: the other ways' numbers stand
        traceback.print_exc()
        row[name] = in_one_line(error)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--widths", default="1,16")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    target = load_model(args.model, args.dtype)
    model = target.model.requires_grad_(False)  # export traces with autograd on: no parameter may ask for it
    report = {"device": str(model.device), "dtype": str(model.dtype), "torch": torch.__version__, "rows": []}
    with tempfile.TemporaryDirectory() as folder:
        for width in (int(width) for width in args.widths.split(",")):
            try:
                row = measure_width(model, width, args.context, args.repeats, Path(folder))
            except Exception as error:  # noqa: BLE001 -- a route that fails here is the finding: said, and kept
                traceback.print_exception(error, file=sys.stderr)
                row = {"width": width, "failed": in_one_line(error)}
            report["rows"].append(row)
            print(" ".join(f"{key} {value}" for key, value in row.items()), flush=True)
            if args.json:
                args.json.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
