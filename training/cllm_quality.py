"""Does the CLLM stay a good model? Its greedy answers against the base model's own, on held-out real prompts.

    python -m training.cllm_quality --prompts ../shared/train/*.jsonl     # writes assets/smollm2-135m-cllm/quality.json

A consistency-trained copy answers differently from its base model; that is allowed, a worse model
is not. On `--count` prompts of the shared mix that no asset trains on (drawn like the plan's, with
the next seed, none in the plan: `real_prompts.unseen`), both models answer greedily, and two numbers compare
them (issue: ship only a CLLM within both bounds):

- the distinct-bigram ratio of each answer (1: nothing repeats; a loop drives it toward 0), mean
  over answers: the CLLM's may be at most `MAX_BIGRAM_DROP` below the base's;
- the base model's per-token negative log-likelihood of each answer (how plausible the base model
  finds it), over all answer tokens: the CLLM's answers may cost at most `MAX_NLL_RATIO` times the
  base's own.
"""

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from specdemo.assets import EMBEDDED_CLLM
from specdemo.methods.cllm import QUALITY_FILE, load_cllm
from specdemo.models import load_model

from . import distill
from .real_prompts import bench_prompts, read_prompts, unseen
from .selfdistill import batch_decode

MAX_BIGRAM_DROP = 0.05
MAX_NLL_RATIO = 1.25


def distinct_bigrams(answers: list[list[int]]) -> float:
    """The share of each answer's token bigrams that are distinct, averaged over answers: 1 when
    nothing repeats, near 0 for an answer stuck in a loop (a cheap check for degeneration)."""
    shares = [len(set(zip(a, a[1:]))) / (len(a) - 1) for a in answers if len(a) > 1]
    return sum(shares) / len(shares)


@torch.inference_mode()
def base_nll(target, prompts_ids: list[list[int]], answers: list[list[int]]) -> float:
    """The base model's mean negative log-likelihood per answer token, teacher-forced."""
    total = count = 0.0
    for ids, answer in zip(prompts_ids, answers):
        if not answer:
            continue
        logits = target.model(torch.tensor([ids + answer], device=target.device)).logits[0, len(ids) - 1 : -1].float()
        total += torch.nn.functional.cross_entropy(logits, torch.tensor(answer, device=target.device), reduction="sum").item()
        count += len(answer)
    return total / count


def measure(target, cllm_target, prompts: list[str], max_new_tokens: int) -> dict:
    prompts_ids = [target.encode_chat(prompt)[0].tolist() for prompt in prompts]
    base = [answer for answer, _ in batch_decode(target, prompts_ids, max_new_tokens)]
    cllm = [answer for answer, _ in batch_decode(cllm_target, prompts_ids, max_new_tokens)]
    result = {
        "prompts": len(prompts), "max_new_tokens": max_new_tokens, "dtype": str(target.dtype).removeprefix("torch."),
        "distinct_bigrams": {"base": distinct_bigrams(base), "cllm": distinct_bigrams(cllm)},
        "base_nll_per_token": {"base": base_nll(target, prompts_ids, base), "cllm": base_nll(target, prompts_ids, cllm)},
        "answers_differ": sum(a != b for a, b in zip(base, cllm)),
    }
    result["bigram_drop"] = result["distinct_bigrams"]["base"] - result["distinct_bigrams"]["cllm"]
    result["nll_ratio"] = result["base_nll_per_token"]["cllm"] / result["base_nll_per_token"]["base"]
    result["bounds"] = {"max_bigram_drop": MAX_BIGRAM_DROP, "max_nll_ratio": MAX_NLL_RATIO}
    result["passes"] = result["bigram_drop"] <= MAX_BIGRAM_DROP and result["nll_ratio"] <= MAX_NLL_RATIO
    return result


def check_quality(args, cllm: Path, count: int, max_new_tokens: int = 128, dtype: str = "float32") -> dict:
    """`measure` on `count` prompts of `args`' files and plan (`distill.add_arguments`) that the
    plan does not hold, for the CLLM in `cllm`; written to its QUALITY_FILE too."""
    prompts = unseen(read_prompts(args.prompts), distill.sampling_plan(args), bench_prompts(), count)
    target = load_model("embedded", dtype)
    cllm_target = dataclasses.replace(target, model=load_cllm(cllm, target))
    result = measure(target, cllm_target, [p.text for p in prompts], max_new_tokens)
    (cllm / QUALITY_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    distill.add_arguments(parser)
    parser.add_argument("--cllm", type=Path, default=EMBEDDED_CLLM)
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    if not args.prompts:
        parser.error("--prompts: give the JSONL files of the shared mix")
    print(json.dumps(check_quality(args, args.cllm, args.count, args.max_new_tokens, args.dtype), indent=2))


if __name__ == "__main__":
    main()
