"""A probe made before the compiled, static-cache target pass was built, not part of the app: the time
of one target pass of the embedded model over k new tokens after a 100-token prefix, eager
transformers with its DynamicCache against `torch.compile` over transformers' StaticCache
(one compiled graph a width k), timed in alternation over 5 rounds of 10 passes each.
docs/history/benchmarks-log.md (2026-11-24, "a probe toward a compiled pass") gives what it measured.

    python scripts/compile_probe.py bfloat16
    python scripts/compile_probe.py float32
"""

import sys
import time

import torch
from transformers import DynamicCache, StaticCache

from specdemo.models import load_model

WIDTHS = (1, 8, 16)
PREFIX = 100


def milliseconds(step, repeats: int = 10) -> float:
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - started) / repeats * 1000


def main(dtype: str, rounds: int = 5) -> None:
    model = load_model("embedded", dtype, "cpu").model
    prompt = torch.arange(100, 100 + PREFIX).unsqueeze(0)
    with torch.inference_mode():
        dynamic = DynamicCache(config=model.config)
        model(prompt, past_key_values=dynamic, use_cache=True)
        static = StaticCache(config=model.config, max_cache_len=512)
        model(prompt, past_key_values=static, use_cache=True, cache_position=torch.arange(PREFIX))
        compiled = torch.compile(model.forward, dynamic=False)
        passes = {}
        for k in WIDTHS:
            fed, positions = torch.arange(300, 300 + k).unsqueeze(0), torch.arange(PREFIX, PREFIX + k)

            def eager(fed=fed, k=k):
                model(fed, past_key_values=dynamic, use_cache=True, logits_to_keep=k)
                dynamic.crop(-k)  # back to the prefix: every pass sees the same cache

            def compiled_pass(fed=fed, positions=positions, k=k):
                compiled(input_ids=fed, past_key_values=static, use_cache=True, cache_position=positions,
                         logits_to_keep=k)
                for layer in static.layers:  # rollback is a length: what lies past it is masked by position
                    layer.cumulative_length.fill_(PREFIX)

            started = time.perf_counter()
            compiled_pass()
            print(f"width {k}: compiled in {time.perf_counter() - started:.0f} s", flush=True)
            eager(), eager(), compiled_pass()  # warm-up
            passes[k] = (eager, compiled_pass)
        # this machine's speed drifts by tens of percent between minutes: the two are timed in
        # alternation, round after round, and each gets its median and range
        times = {(k, kind): [] for k in WIDTHS for kind in ("eager", "compiled")}
        for round_ in range(rounds):
            for k, (eager, compiled_pass) in passes.items():
                for kind, step in (("eager", eager), ("compiled", compiled_pass))[:: 1 if round_ % 2 == 0 else -1]:
                    times[k, kind].append(milliseconds(step))
        for k in WIDTHS:
            eager_ms, compiled_ms = sorted(times[k, "eager"]), sorted(times[k, "compiled"])
            ratios = sorted(e / c for e, c in zip(times[k, "eager"], times[k, "compiled"]))
            print(f"{dtype}, {k} token(s): eager {eager_ms[rounds // 2]:.1f} ms "
                  f"({eager_ms[0]:.1f}-{eager_ms[-1]:.1f}), compiled {compiled_ms[rounds // 2]:.1f} ms "
                  f"({compiled_ms[0]:.1f}-{compiled_ms[-1]:.1f}); eager / compiled, round by round: median "
                  f"{ratios[rounds // 2]:.2f}x ({ratios[0]:.2f}x-{ratios[-1]:.2f}x)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
