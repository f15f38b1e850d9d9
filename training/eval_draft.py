"""How often the draft agrees with the target on a prompt file, by category.

    python -m training.eval_draft [--prompts specdemo/prompts.jsonl] [--max-new-tokens 96]

For each prompt the target answers greedily; the draft then reads that answer (teacher-forced)
and predicts each next token. Top-1 agreement is the chance that greedy speculative decoding
accepts a draft token, so with agreement a the expected tokens per target pass at draft length
γ is (1 - a^(γ+1)) / (1 - a) (Leviathan et al. 2023, Eq. 1). The training report measures the
same thing on held-out *training-style* prompts; this measures it on real ones.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from specdemo import final_summary, load_model
from specdemo.bench import DEFAULT_PROMPTS, read_prompts
from specdemo.methods import ar
from specdemo.methods.draft import load_draft


@torch.inference_mode()
def agreement_by_category(prompts: Path, max_new_tokens: int, dtype: str, limit: int | None) -> dict[str, dict]:
    target = load_model("embedded", dtype, "cpu")
    draft = load_draft("embedded", target)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for row in read_prompts(prompts, limit):
        input_ids = target.encode_chat(row["turns"][0])
        answer = final_summary(ar.generate(target.model, input_ids, max_new_tokens=max_new_tokens, eos_token_ids=target.eos_token_ids)).tokens
        text = torch.cat([input_ids, torch.tensor([answer])], dim=-1)
        logits = draft.logits(text, None, logits_to_keep=len(answer) + 1)[0, :-1]  # [len(answer), K]
        agree = int((draft.token_ids(logits.argmax(dim=-1)) == torch.tensor(answer)).sum())
        for key in (row.get("category", "all"), "overall"):
            counts[key][0] += agree
            counts[key][1] += len(answer)
    return {key: {"top1_agreement": a / n, "tokens": n} for key, (a, n) in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    result = agreement_by_category(args.prompts, args.max_new_tokens, args.dtype, args.limit)
    for key, stats in result.items():
        expected = {g: (1 - stats["top1_agreement"] ** (g + 1)) / (1 - stats["top1_agreement"]) for g in (2, 3, 5)}
        print(f"{key:<14} agreement {stats['top1_agreement']:.3f} over {stats['tokens']:>5} tokens; "
              f"expected tokens/pass " + ", ".join(f"γ={g}: {v:.2f}" for g, v in expected.items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
