"""How often a draft agrees with the target on a prompt file, by category.

    python -m training.eval_draft [--draft feature|token] [--prompts specdemo/prompts.jsonl] [--per-category N] [--max-new-tokens 96]
    python -m training.eval_draft --folders assets/smollm2-135m-eagle build/eagle-new ...   # feature drafts side by side

For each prompt the target answers greedily; the draft then reads that answer (teacher-forced:
the feature draft the target's own features, the token draft the tokens) and predicts each next
token. Top-1 agreement is the chance that greedy speculative decoding accepts a drafted chain's
token, so with agreement a the expected tokens per target pass at draft length γ is
(1 - a^(γ+1)) / (1 - a) (Leviathan et al. 2023, Eq. 1); top-3 agreement, how often the target's
token is among the three a tree's node may branch into; "in vocabulary", how often the draft
could propose it at all (its vocabulary is the target's most used tokens). The training reports
measure the same on held-out *training-style* prompts; this measures it on real ones
(Spec-Bench's: `git show 4f4c763:docs/methods/speculative.md`). With `--folders`, several feature drafts read the same
answers, so their agreements differ by the drafts alone: in bfloat16 a bench run's answers differ
between drafts wherever two tokens nearly tie, which moves its tokens a pass by category more than
a small change of the draft does.
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch

from specdemo import final_summary, load_model
from specdemo.assets import EMBEDDED_EAGLE
from specdemo.bench import DEFAULT_PROMPTS, read_prompts
from specdemo.core.static import with_layers
from specdemo.methods import ar
from specdemo.methods.draft import load_draft
from specdemo.methods.eagle import FeatureDraft, load_feature_draft

TOP = 3  # a draft tree's default top_k


def predictions(draft, target, text: torch.Tensor, answer_length: int, out=None) -> torch.Tensor:
    """The draft's `TOP` best guesses [answer_length, TOP] (token ids) for each answer token of
    `text` [1, n], each from what precedes it. `out`: the target decoder's output over `text` with
    every hidden state, when several drafts read the same text (made here when None)."""
    if isinstance(draft, FeatureDraft):  # pair t (f_t, x_{t+1}) predicts x_{t+2}; f_t with its layers' residual stream, if it reads them
        out = out if out is not None else target.model.get_decoder()(text, output_hidden_states=bool(draft.layers))
        features = with_layers(out, draft.layers)
        logits = draft.logits(draft.features(features[:, :-1], text[:, 1:], None))[0, -answer_length - 1 : -1]
    else:
        logits = draft.logits(text, None, logits_to_keep=answer_length + 1)[0, :-1]
    return draft.token_ids(logits.topk(TOP, dim=-1).indices)


def agreement_by_category(prompts: Path, max_new_tokens: int, dtype: str, limit: int | None, per_category: int | None = None,
                          kind: str = "feature", folders: list[Path] | None = None) -> dict[str, dict[str, dict]]:
    """Each draft's agreement by category (`count_agreement`), keyed by its name: the token draft,
    or each feature draft of `folders` (default: the shipped one)."""
    target = load_model("embedded", dtype, "cpu")  # outside inference mode: its weights stay packable (`core.prepack`)
    if kind == "feature":
        drafts = {str(folder): load_feature_draft(folder, target.model) for folder in folders or [EMBEDDED_EAGLE]}
    else:
        drafts = {"token": load_draft("embedded", target)}
    with torch.inference_mode():
        return count_agreement(target, drafts, read_prompts(prompts, limit, per_category), max_new_tokens)


def count_agreement(target, drafts: dict, rows: list[dict], max_new_tokens: int) -> dict[str, dict[str, dict]]:
    """For each of `drafts` (name: draft), by category and overall: how often its first guess is the
    target's next token, how often one of its `TOP`, how often that token is in its vocabulary, over
    the target's greedy answers to `rows`, which every draft reads alike."""
    counts = {name: defaultdict(lambda: [0, 0, 0, 0]) for name in drafts}  # top-1, top-3, in vocabulary, tokens
    for row in rows:
        input_ids = target.encode_chat(row["turns"][0])
        answer = torch.tensor(final_summary(ar.generate(target.model, input_ids, max_new_tokens=max_new_tokens, eos_token_ids=target.eos_token_ids)).tokens)
        text = torch.cat([input_ids, answer[None]], dim=-1)
        # one target pass that every feature draft reads (the token draft reads the tokens alone)
        out = target.model.get_decoder()(text, output_hidden_states=True) if any(isinstance(d, FeatureDraft) for d in drafts.values()) else None
        for name, draft in drafts.items():
            guesses = predictions(draft, target, text, len(answer), out)  # [n, TOP]
            in_vocab = len(answer) if draft.vocab is None else int(torch.isin(answer, draft.vocab).sum())
            for key in (row.get("category", "all"), "overall"):
                for i, value in enumerate((int((guesses[:, 0] == answer).sum()), int((guesses == answer[:, None]).any(-1).sum()), in_vocab, len(answer))):
                    counts[name][key][i] += value
    return {name: {key: {"top1_agreement": a / n, "top3_agreement": a3 / n, "in_vocabulary": v / n, "tokens": n} for key, (a, a3, v, n) in by_key.items()}
            for name, by_key in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", choices=["feature", "token"], default="feature", help="the feature draft (speculative's) or the token draft (hf_assisted's)")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--per-category", type=int, default=None, help="only the first N prompts of each category")
    parser.add_argument("--folders", type=Path, nargs="+", default=None,
                        help="feature drafts' folders, each read over the same answers (default: the shipped draft)")
    args = parser.parse_args()
    result = agreement_by_category(args.prompts, args.max_new_tokens, args.dtype, args.limit, args.per_category, args.draft, args.folders)
    for name, by_key in result.items():
        print(name)
        for key, stats in by_key.items():
            expected = {g: (1 - stats["top1_agreement"] ** (g + 1)) / (1 - stats["top1_agreement"]) for g in (2, 3, 5)}
            print(f"  {key:<14} agreement {stats['top1_agreement']:.3f}, top-{TOP} {stats['top3_agreement']:.3f}, in vocabulary "
                  f"{stats['in_vocabulary']:.3f} over {stats['tokens']:>5} tokens; expected tokens/pass " + ", ".join(f"γ={g}: {v:.2f}" for g, v in expected.items()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
