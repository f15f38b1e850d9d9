"""Train Medusa heads for the embedded SmolLM2-135M-Instruct by self-distillation, on this CPU.

    python -m training.train_medusa          # data (cached in build/), hidden states, training, assets/

The target stays frozen. Its greedy answers to our own prompts (training/prompts.py, never the
bench prompts) are the data; the target's last hidden state at each answer position is computed
once (in bfloat16, as the app and the bench run it) and head k learns the token k + 2 places
ahead (Cai et al. 2024, Medusa-1). Each head is one residual block in front of the target's own
LM head, so only the blocks are stored. The softmax of the training loss runs over the draft's
8,192-token vocabulary (the tokens our answers use most) to fit the CPU; the heads are measured
with the full LM head, exactly as decoding uses them. The default tree is grown from those
measured accuracies. Seeded; writes assets/smollm2-135m-medusa/ and its MANIFEST.md.
"""

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from specdemo.bench import DEFAULT_PROMPTS
from specdemo.draft import EMBEDDED_DRAFT
from specdemo.medusa import EMBEDDED_HEADS, MedusaHeads
from specdemo.models import load_model

from .prompts import first_stage_prompts, without_bench_prompts
from .selfdistill import target_answers


def build_data(target, args) -> dict:
    """Greedy answers to `args.prompts` of our prompts, and the target's hidden states on them."""
    bench = {json.loads(line)["turns"][0] for line in DEFAULT_PROMPTS.read_text().splitlines() if line.strip()}
    prompts = without_bench_prompts(first_stage_prompts(args.seed), bench)[: args.prompts]
    torch.manual_seed(args.seed)
    answers = target_answers(target, prompts, args.max_new_tokens, args.batch_size)
    hidden, tokens = [], []
    decoder = target.model.get_decoder()
    with torch.inference_mode():
        for prompt, answer in zip(prompts, answers):
            prompt_ids = target.encode_chat(prompt)[0].tolist()
            sequence = prompt_ids + answer
            states = decoder(input_ids=torch.tensor([sequence])).last_hidden_state[0].float()
            first = len(prompt_ids) - 1  # the hidden state that predicts the answer's first token
            hidden.append(states[first:])
            tokens.append(torch.tensor(sequence[first:]))
    return {"prompts": prompts, "hidden": hidden, "tokens": tokens}


def head_targets(tokens: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[n, K] labels: at position t, head k's label is token t + k + 2 (-100 past the end)."""
    n = tokens.shape[0]
    labels = torch.full((n, num_heads), -100, dtype=torch.long)
    for k in range(num_heads):
        shift = k + 2
        if n > shift:
            labels[: n - shift, k] = tokens[shift:]
    return labels


@torch.no_grad()
def measure(heads: MedusaHeads, hidden: torch.Tensor, labels: torch.Tensor, top_k: int = 10) -> dict:
    """Per head: top-1 accuracy, top-5 accuracy, and the share correct at each rank < top_k,
    all with the full LM head (as decoding uses it)."""
    rank_hits = torch.zeros(heads.num_heads, top_k)
    counts = torch.zeros(heads.num_heads)
    for start in range(0, hidden.shape[0], 1024):
        logits = heads(hidden[start : start + 1024])  # [K, b, V]
        top = logits.topk(top_k, dim=-1).indices  # [K, b, top_k]
        gold = labels[start : start + 1024].T  # [K, b]
        valid = gold >= 0
        hits = (top == gold[..., None]) & valid[..., None]
        rank_hits += hits.sum(dim=1).float()
        counts += valid.sum(dim=1).float()
    by_rank = rank_hits / counts[:, None]
    return {"top1": by_rank[:, 0].tolist(), "top5": by_rank[:, :5].sum(-1).tolist(), "by_rank": by_rank.tolist()}


def grow_tree(by_rank: list[list[float]], size: int) -> list[list[int]]:
    """The `size` paths of highest estimated acceptance: a path's estimate is the product of its
    nodes' measured accuracies at their rank (Medusa's tree construction, Sec. 2.1.2 / 3.3)."""
    chosen: list[tuple[int, ...]] = []
    frontier = {(rank,): by_rank[0][rank] for rank in range(len(by_rank[0]))}
    while len(chosen) < size and frontier:
        path = max(frontier, key=frontier.get)
        score = frontier.pop(path)
        chosen.append(path)
        if len(path) < len(by_rank):
            for rank in range(len(by_rank[len(path)])):
                frontier[path + (rank,)] = score * by_rank[len(path)][rank]
    return [list(path) for path in chosen]


def train(args) -> dict:
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    data_path = Path(args.data)
    if data_path.exists():
        data = torch.load(data_path)
    else:
        target = load_model("embedded", "bfloat16", "cpu")
        start = time.time()
        data = build_data(target, args)
        data["minutes"] = (time.time() - start) / 60
        data_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, data_path)
    target = load_model("embedded", "float32", "cpu")
    lm_head = target.model.get_output_embeddings()
    lm_head.weight.requires_grad_(False)
    order = list(range(len(data["prompts"])))
    rng.shuffle(order)
    held_out, train_ids = order[: args.held_out], order[args.held_out :]
    stack = lambda ids, key: torch.cat([data[key][i] for i in ids])  # noqa: E731
    labels_of = lambda ids: torch.cat([head_targets(data["tokens"][i], args.heads) for i in ids])  # noqa: E731
    train_hidden, train_labels = stack(train_ids, "hidden"), labels_of(train_ids)
    eval_hidden, eval_labels = stack(held_out, "hidden"), labels_of(held_out)
    vocab = torch.tensor(json.loads((EMBEDDED_DRAFT / "draft_vocab.json").read_text()))
    to_subset = torch.full((lm_head.weight.shape[0],), -100, dtype=torch.long)
    to_subset[vocab] = torch.arange(len(vocab))
    subset_head = lm_head.weight[vocab]  # [S, H], frozen
    heads = MedusaHeads(target.model.config.hidden_size, target.model.config.vocab_size, args.heads, 1, lm_head)
    optimizer = torch.optim.AdamW(heads.blocks.parameters(), lr=args.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(train_hidden.shape[0] / args.batch)
    total = steps_per_epoch * args.epochs
    history = [{"epoch": 0, **measure(heads, eval_hidden, eval_labels)}]
    print(json.dumps({k: history[-1][k] for k in ("top1", "top5")}), flush=True)
    step, start = 0, time.time()
    for epoch in range(args.epochs):
        permutation = torch.randperm(train_hidden.shape[0])
        losses = []
        for first in range(0, len(permutation), args.batch):
            batch = permutation[first : first + args.batch]
            lr = args.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / total))
            for group in optimizer.param_groups:
                group["lr"] = lr
            hidden, labels = train_hidden[batch], to_subset[train_labels[batch].clamp(min=0)]
            labels[train_labels[batch] < 0] = -100
            loss = sum(
                # later heads weigh less, as their labels are harder (Medusa-1 uses 0.8^k)
                0.8**k * torch.nn.functional.cross_entropy(block(hidden) @ subset_head.T, labels[:, k], ignore_index=-100)
                for k, block in enumerate(heads.blocks)
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
        history.append({"epoch": epoch + 1, "train_loss": sum(losses) / len(losses), **measure(heads, eval_hidden, eval_labels)})
        print(json.dumps({k: history[-1][k] for k in ("epoch", "train_loss", "top1", "top5")}), f"{time.time() - start:.0f}s", flush=True)
    tree = grow_tree(history[-1]["by_rank"], args.tree_size)
    heads.save(EMBEDDED_HEADS, medusa_choices=tree, base_model="embedded SmolLM2-135M-Instruct")
    return {
        "history": history, "tree": tree, "train_prompts": len(train_ids), "held_out_prompts": len(held_out),
        "train_positions": int(train_hidden.shape[0]), "held_out_positions": int(eval_hidden.shape[0]),
        "data_minutes": data.get("minutes"), "train_minutes": (time.time() - start) / 60,
    }


def write_manifest(args, report: dict) -> None:
    final, first = report["history"][-1], report["history"][0]
    rows = "\n".join(
        f"| {k} | {first['top1'][k]:.3f} | {final['top1'][k]:.3f} | {final['top5'][k]:.3f} |" for k in range(args.heads)
    )
    curve = "\n".join(f"| {h['epoch']} | {h['train_loss']:.3f} | {' / '.join(f'{a:.3f}' for a in h['top1'])} |" for h in report["history"][1:])
    size = (EMBEDDED_HEADS / "medusa_heads.safetensors").stat().st_size / 1e6
    (EMBEDDED_HEADS / "MANIFEST.md").write_text(f"""# Medusa heads for the embedded SmolLM2-135M-Instruct

**What it is.** {args.heads} Medusa heads (Cai et al. 2024): head k is one residual block
x + SiLU(W x + b) on the target's last hidden state, followed by the target's own LM head (not
stored here), and predicts the token k + 2 places ahead. `medusa_config.json` also holds the
default candidate tree (`medusa_choices`, {len(report['tree'])} nodes), grown from the accuracies below.
Loaded by `specdemo.medusa.load_heads(EMBEDDED_HEADS, target)`, no network.

**Command** (from a clean checkout, after `make setup`):

    .venv/bin/python -m training.train_medusa

It generates the data into `build/medusa-data.pt` when missing ({report['data_minutes'] or 0:.0f} min here),
then trains ({report['train_minutes']:.0f} min here, 2 CPU cores), seed {args.seed}.

**Data.** Self-distillation: the target's greedy answers (bfloat16, at most {args.max_new_tokens} new
tokens) to the first {args.prompts} of our template prompts (`training/prompts.py`: writing, QA,
explanations, coding, arithmetic, translation; no benchmark prompt). {report['train_prompts']} prompts
({report['train_positions']} positions) train, {report['held_out_prompts']} held-out prompts
({report['held_out_positions']} positions) measure. Loss: cross-entropy of head k against the token
k + 2 ahead, weighted 0.8^k, softmax over the draft's 8,192-token vocabulary; AdamW lr {args.lr},
cosine, {args.epochs} epochs, batches of {args.batch} positions.

**Size.** `medusa_heads.safetensors` {size:.1f} MB.

**Measured on the held-out answers** (teacher-forced, full LM head; `training_report.json`):

| head (token ahead) | top-1 before | top-1 after | top-5 after |
| --- | --- | --- | --- |
{rows}

| epoch | train loss | held-out top-1 per head |
| --- | --- | --- |
{curve}

Speed on the benchmark prompts: `python -m specdemo.bench --methods ar,medusa` (see the README).
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="build/medusa-data.pt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=640)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=32, help="of answer generation")
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=1024, help="positions per training step")
    parser.add_argument("--held-out", type=int, default=40)
    parser.add_argument("--tree-size", type=int, default=12)
    args = parser.parse_args()
    report = train(args)
    report["args"] = vars(args)
    (EMBEDDED_HEADS / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    write_manifest(args, report)
    print(json.dumps({"top1": report["history"][-1]["top1"], "tree": report["tree"]}))


if __name__ == "__main__":
    main()
