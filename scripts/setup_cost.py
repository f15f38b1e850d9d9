"""What a fresh process pays before its first token on this device, part by part: each ZeroGPU call
is such a process (docs/hosting.md), and this is the prepared GPU check's measure of it
(`scripts/gpu_check.sh`). In one process, with the embedded model:
- the target loaded onto the device: on ZeroGPU at the Space's start, not in a call;
- its graphs captured (`models.capture`): a call's setup, which `clicks.ready` measures and a
  click's plan counts;
- for each method, its companions loaded with their own graphs (`methods.method_options`), in
  every call of that method; then two answers of a few tokens to one prompt: the first also
  captures what the method captures at its first use (a draft tree's graph, Medusa's heads'), the
  second replays it. `clicks.ready` measures the companions and a first short answer together,
  and a click's plan counts them.

Each part is timed to the device's last work and printed as it ends (a run cut short keeps what
it measured); `--json` is rewritten after each.

    PYTHONPATH=. python scripts/setup_cost.py [--dtype bfloat16] [--methods ar,speculative,medusa,lookahead,cllm] \
        [--tokens 16] [--no-compile] [--json OUT]

On a CPU the graphs are inductor's compiled passes, which take minutes: `--no-compile` times the rest.
"""

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

from specdemo.bench import specdemo_runner
from specdemo.core.errors import SpecDemoError, in_one_line
from specdemo.methods import get_method, method_options
from specdemo.models import capture, load_model

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def measure(run, name: str, parts: dict, out: Path | None):
    """run()'s value, its seconds (to the device's last work) kept in `parts` as `name`, printed and written."""
    started = time.perf_counter()
    value = run()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    parts[name] = round(time.perf_counter() - started, 3)
    print(f"{name}: {parts[name]:.2f} s", flush=True)
    if out:
        out.write_text(json.dumps(parts, indent=1) + "\n")
    return value


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--methods", default="ar,speculative,medusa,lookahead,cllm")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    parts = {}
    target = measure(lambda: load_model(dtype=args.dtype), "the target onto the device", parts, args.json)
    if args.compile:
        target = measure(lambda: capture(target)[0], "the target's graphs", parts, args.json)
    input_ids = target.encode_chat(PROMPT)
    answers = {}
    for name in args.methods.split(","):
        try:
            answers[name] = method_parts(target, name, input_ids, args.tokens, parts, args.json)
        except SpecDemoError:
            raise
        except Exception as error:  # noqa: BLE001 -- one method's fault: the others are still measured
            print(f"{name}: failed: {in_one_line(error)}", flush=True)
            traceback.print_exception(error, file=sys.stderr)
    return {"parts": parts, "answers": answers}


def method_parts(target, name: str, input_ids: torch.Tensor, tokens: int, parts: dict,
                 out: Path | None) -> list[list[int]]:
    """`name`'s companions and its two answers of `tokens` tokens, measured into `parts`; the answers' tokens."""
    get_method(name)  # known, or a sentence saying which are
    measure(lambda: method_options(name, target), f"{name}: its companions", parts, out)
    answers = [measure(lambda: specdemo_runner(name)(target, input_ids, tokens),
                       f"{name}: its {answer} answer of {tokens} tokens", parts, out).tokens
               for answer in ("first", "second")]
    print(f"{name}: the two answers {'agree' if answers[0] == answers[1] else 'differ'}", flush=True)
    return answers


if __name__ == "__main__":
    main()
