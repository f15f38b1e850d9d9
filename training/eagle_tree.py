"""The static draft tree of a feature draft: the rank paths it gets right most often.

    python -m training.eagle_tree [--folder assets/smollm2-135m-eagle] [--per-source 24] [--depth 6] [--nodes 64]

A static draft tree (`specdemo.methods.static_draft_tree`) has one shape every pass; the best
shape of n nodes holds the n rank paths greedy verification accepts most often (Medusa's
`medusa_choices`, Cai et al. 2024, Sec. 2.1.2, made the same way here for a draft). The target
answers `--per-source` prompts of each file in ../shared/train greedily (float32, none that is
or nearly copies a bench prompt); at each answer position the draft drafts `--depth` steps on
its own features (`train_eagle.drafted_features`, the true tokens fed, as an accepted path
would be), and a path of ranks (r_1, ..., r_d) counts where the true tokens are the draft's r_i-th
best at every step i. The paths counted most often, best first, go into the draft's config as
`tree_choices`, which `speculative.generate(static_tree=True)` takes, with the tokens a pass
each size would commit on these answers (the target's token included; no copied branch).
The draft may have trained on some of these prompts: they choose a shape, they show no gain.
"""

import argparse
import json
import random
from pathlib import Path

import torch

from specdemo import final_summary
from specdemo.assets import EMBEDDED_EAGLE
from specdemo.core.static import with_layers
from specdemo.methods import ar
from specdemo.methods.eagle import CONFIG_FILE, load_feature_draft
from specdemo.methods.speculative import MAX_STATIC_NODES
from specdemo.models import load_model

from .real_prompts import SHARED_TRAIN, HeldOut, bench_prompts, read_prompts
from .train_eagle import drafted_features
from .train_medusa import best_tree, count_paths, expected_accept_length

MAX_RANK = 10  # a step's rank at most this, less one: a tree's node seldom holds the draft's 11th best


def prompts_for(per_source: int, seed: int) -> list[str]:
    """`per_source` prompts of each file of ../shared/train, seeded, none copying a bench prompt."""
    held, rng, chosen = HeldOut(bench_prompts()), random.Random(seed), []
    for path in sorted(SHARED_TRAIN.glob("*.jsonl")):
        texts = sorted({p.text for p in read_prompts([path]) if len(p.text) <= 1500 and not held.copied_by(p.text)})
        chosen += rng.sample(texts, per_source)
    return chosen


@torch.inference_mode()
def answer(target, prompt: str, max_new_tokens: int) -> tuple[list[int], int]:
    """The prompt's chat ids followed by the target's greedy answer, and where the answer starts."""
    ids = target.encode_chat(prompt)
    tokens = final_summary(ar.generate(target.model, ids, max_new_tokens=max_new_tokens,
                                       eos_token_ids=target.eos_token_ids)).tokens
    return [*ids[0].tolist(), *tokens], ids.shape[1]


@torch.inference_mode()
def rank_rows(draft, target, sequence: list[int], start: int, depth: int) -> list[list[int]]:
    """For each answer position p (the text up to p is known, x_(p+1) comes next): the rank of
    each true token x_(p+1), ..., x_(p+depth) among the draft's best at drafting steps 1..depth from
    there (MAX_RANK: not among them, or outside its vocabulary), the draft on its own features
    after the first step."""
    ids = torch.tensor([sequence])
    out = target.model.get_decoder()(ids, output_hidden_states=bool(draft.layers))
    predicted = drafted_features(draft, with_layers(out, draft.layers).float(), ids, depth)  # [D, 1, T-1, H]
    ranked = [draft.token_ids(draft.logits(predicted[d, 0]).topk(MAX_RANK, dim=-1).indices) for d in range(depth)]
    rows = []
    for p in range(start - 1, len(sequence) - 1):  # step d (0-based) from p reads entry t = p + d - 1, for x_(t+2)
        row = []
        for d in range(depth):
            t = p + d - 1
            if t + 2 >= len(sequence):
                break
            hits = (ranked[d][t] == sequence[t + 2]).nonzero()
            row.append(int(hits[0]) if len(hits) else MAX_RANK)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=EMBEDDED_EAGLE)
    parser.add_argument("--per-source", type=int, default=24)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.nodes > MAX_STATIC_NODES:
        raise SystemExit(f"--nodes: at most {MAX_STATIC_NODES}")
    target = load_model("embedded", "float32", "cpu")
    draft = load_feature_draft(args.folder, target.model)
    rows = []
    for number, prompt in enumerate(prompts_for(args.per_source, args.seed), 1):
        sequence, start = answer(target, prompt, args.max_new_tokens)
        rows += rank_rows(draft, target, sequence, start, args.depth)
        print(f"{number} answers, {len(rows)} positions", flush=True)
    paths = count_paths(rows, MAX_RANK)
    choices = best_tree(paths, args.nodes)
    config_path = args.folder / CONFIG_FILE
    config = json.loads(config_path.read_text())
    config["tree_choices"] = choices
    config["tree_tokens_per_pass"] = {
        n: round(1 + expected_accept_length(paths, len(rows), choices[:n]), 3) for n in (1, 8, 16, 31, 48, 56, 60, 64)
        if n <= len(choices)}
    config["tree_choices_from"] = (f"python -m training.eagle_tree --per-source {args.per_source} --max-new-tokens "
                                   f"{args.max_new_tokens} --depth {args.depth} --nodes {args.nodes} --seed {args.seed}: "
                                   f"{len(rows)} answer positions")
    config_path.write_text("{\n" + ",\n".join(f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in config.items())
                           + "\n}\n")  # a key a line
    print(json.dumps({key: config[key] for key in ("tree_tokens_per_pass", "tree_choices_from")}, indent=1))


if __name__ == "__main__":
    main()
