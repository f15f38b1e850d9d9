"""A probe for issue 27 (a compiled, static-cache target pass), not part of the app: the time
of one target pass of the embedded model over k new tokens after a 100-token prefix, eager
transformers with its DynamicCache against `torch.compile` over transformers' StaticCache
(one compiled graph a width k). docs/benchmarks.md gives what it measured.

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


def milliseconds(step, repeats: int = 30) -> float:
    for _ in range(3):  # warm-up
        step()
    started = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - started) / repeats * 1000


def main(dtype: str) -> None:
    model = load_model("embedded", dtype, "cpu").model
    prompt = torch.arange(100, 100 + PREFIX).unsqueeze(0)
    with torch.inference_mode():
        for k in WIDTHS:
            cache = DynamicCache(config=model.config)
            model(prompt, past_key_values=cache, use_cache=True)
            fed = torch.arange(300, 300 + k).unsqueeze(0)

            def eager(fed=fed, cache=cache, k=k):
                model(fed, past_key_values=cache, use_cache=True, logits_to_keep=k)
                cache.crop(-k)  # back to the prefix: every pass sees the same cache

            print(f"{dtype} eager, {k} token(s): {milliseconds(eager):.1f} ms", flush=True)
        static = StaticCache(config=model.config, max_cache_len=512)
        model(prompt, past_key_values=static, use_cache=True, cache_position=torch.arange(PREFIX))
        compiled = torch.compile(model.forward, dynamic=False)
        for k in WIDTHS:
            fed, positions = torch.arange(300, 300 + k).unsqueeze(0), torch.arange(PREFIX, PREFIX + k)

            def pass_(fed=fed, positions=positions, k=k):
                compiled(input_ids=fed, past_key_values=static, use_cache=True, cache_position=positions, logits_to_keep=k)
                for layer in static.layers:  # rollback is a length: what lies past it is masked by position
                    layer.cumulative_length.fill_(PREFIX)

            started = time.perf_counter()
            pass_()
            print(f"{dtype} compiled (static cache), {k} token(s): compiled in {time.perf_counter() - started:.0f} s, "
                  f"{milliseconds(pass_):.1f} ms a pass", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bfloat16")
