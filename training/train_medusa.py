"""Train Medusa heads for the embedded SmolLM2-135M-Instruct by self-distillation, on this CPU.

    python -m training.train_medusa      # data (shared with the draft, in build/), training, tree, assets/

The target stays frozen. The data are its own answers to our training prompts
(training/selfdistill.py, never the bench prompts): greedy, as greedy Medusa decoding will see
them, and sampled at temperature 0.8 to a second set of prompts, for variety (on the bench
prompts 1.91 tokens a pass against 1.87 with the greedy answers alone). Its last hidden
state at each answer position is computed once, in bfloat16 as the app and the bench run it,
with the target's own next-token distribution there. Head k at position t learns the target's
distribution for the token t + k + 2 (Cai et al. 2024: Medusa-1 heads, trained by
self-distillation with the teacher's soft labels, Sec. 2.3.2). Each head is residual blocks in
front of the target's own LM head, restricted to the 8,192 tokens the answers use most: the
heads propose only from those, which makes proposing cheap, and the target still verifies
exactly. The static tree is the set of rank paths most often right on held-out answers; its size is
also the dynamic tree's (`medusa_tree.dynamic_paths`), the default.
Seeded; writes assets/smollm2-135m-medusa/ and its MANIFEST.md.
"""

import argparse
import functools
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file

from specdemo.assets import EMBEDDED_HEADS
from specdemo.methods.medusa_heads import HEADS_FILE, VOCAB_KEY, MedusaHeads
from specdemo.models import load_model

from . import distill, selfdistill
from .schedule import Schedule, epochs_done
from .selfdistill import (
    SAMPLED_COMMAND,
    SAMPLED_DATA,
    SAMPLED_DATA_TEXT,
    VARIED_COMMAND,
    VARIED_DATA_TEXT,
    draft_vocabulary,
    load_split,
    optional_path,
)

READS_TOKEN_TEXT = """W_k [h; e(x)]: the target's last hidden state h and the target's embedding of the
token x that h predicted, the last committed one (`--reads-token`; W_k starts as [I 0], so a new head is a
Medusa-1 head, and learns what x adds: Medusa-1's heads guess past x blind, and Hydra, Ankner et al. 2024,
showed how much heads gain from reading the tokens before their own; these read only that verified one,
so all heads still run in one call)"""
READS_PATH_TEXT = """W_k [h; e(x); e(y_1); ...; e(y_k)]: the target's last hidden state h, the target's embedding of the
token x that h predicted, the last committed one, and of the k tokens y_1 ... y_k the head's tree path holds
before its own (`--reads-path`: Hydra's sequentially dependent heads, Ankner et al. 2024; teacher-forced on the
target's own tokens in training; in decoding the tree grows a level a call, each node's children guessed from
its own path). A head started from one that read x alone keeps its columns, the new ones zero, so it starts as that head"""
TEACHER_TOP = 32  # soft labels keep the teacher's 32 most likely tokens (renormalised)
MAX_RANK = 10  # ranks measured per head, and so the widest a tree may branch


@torch.inference_mode()
def answer_states(target, data: dict, ids: list[int], proposal_weight: torch.Tensor) -> dict:
    """For every answer position of the sequences `ids`: the target's last hidden state [N, H]
    (bfloat16; from `data["features"]` when the data hold them, else one target pass a
    sequence), the token that follows it, the teacher's top tokens and probabilities over the
    proposal vocabulary, and `rest`, how many more positions its sequence has after it."""
    decoder = target.model.get_decoder()
    hidden, next_tokens, teacher_ids, teacher_probs, rest = [], [], [], [], []
    start = time.time()
    for count, i in enumerate(ids):
        sequence, first = data["sequences"][i], data["answer_starts"][i] - 1  # position `first` predicts the answer's first token
        if "features" in data:
            states = data["features"][i][first : len(sequence) - 1].to(target.device, target.dtype)  # [n, H]
        else:
            states = decoder(input_ids=torch.tensor([sequence])).last_hidden_state[0, first:-1]  # [n, H]
        probs = torch.softmax(states.float() @ proposal_weight.T, dim=-1).topk(TEACHER_TOP)
        hidden.append(states)
        next_tokens.append(torch.tensor(sequence[first + 1 :]))
        teacher_ids.append(probs.indices.short())
        teacher_probs.append((probs.values / probs.values.sum(-1, keepdim=True)).half())
        rest.append(torch.arange(len(states) - 1, -1, -1))
        if count % 200 == 0:
            print(f"  hidden states: {count}/{len(ids)} sequences, {time.time() - start:.0f}s", flush=True)
    cat = torch.cat
    return {"hidden": cat(hidden), "next": cat(next_tokens), "teacher_ids": cat(teacher_ids), "teacher_probs": cat(teacher_probs), "rest": cat(rest)}


def soft_loss(heads: MedusaHeads, states: dict, batch: torch.Tensor) -> torch.Tensor:
    """Sum over heads of 0.8^k x the cross-entropy of head k at position t against the teacher's
    distribution at position t + k + 1 (that of token t + k + 2); positions whose sequence ends
    sooner do not count. Later heads weigh less, as their targets are harder (Medusa-1)."""
    logits = heads(states["hidden"][batch].float(), head_tokens(heads, states, batch))  # [K, B, S]
    loss = 0.0
    for k in range(heads.num_heads):
        valid = states["rest"][batch] >= k + 1
        source = batch[valid] + k + 1
        log_probs = torch.log_softmax(logits[k][valid], dim=-1).gather(-1, states["teacher_ids"][source].long())
        loss = loss + 0.8**k * -(states["teacher_probs"][source].float() * log_probs).sum(-1).mean()
    return loss


def head_tokens(heads: MedusaHeads, states: dict, batch: torch.Tensor) -> torch.Tensor:
    """The tokens the heads read at positions `batch`: the token each hidden state predicted [B];
    for heads that read their path, the K tokens after it [B, K], the target's own (teacher
    forcing: a path is accepted only while its tokens are the target's). Past a sequence's end they
    are the next sequence's, read only by heads whose target is past the end too (`rest`)."""
    if not heads.reads_path:
        return states["next"][batch]
    ahead = (batch[:, None] + torch.arange(heads.num_heads)).clamp(max=len(states["next"]) - 1)
    return states["next"][ahead]


@torch.no_grad()
def rank_paths(heads: MedusaHeads, states: dict, proposal_vocab: torch.Tensor) -> tuple[torch.Tensor, Counter, int]:
    """On answers the target wrote greedily: the share of positions where head k's rank-r token
    is the true token t + k + 2 ([K, MAX_RANK]), and how often each path of ranks (r_0, ..., r_d)
    is right at every depth, i.e. accepted by greedy verification (Counter), over `positions`."""
    num_heads = heads.num_heads
    to_subset = torch.full((max(int(proposal_vocab.max()), int(states["next"].max())) + 1,), -1, dtype=torch.long)
    to_subset[proposal_vocab] = torch.arange(len(proposal_vocab))
    ranks = []
    for first in range(0, len(states["next"]), 2048):
        batch = torch.arange(first, min(first + 2048, len(states["next"])))
        top = heads(states["hidden"][batch].float(), head_tokens(heads, states, batch)).topk(MAX_RANK, dim=-1).indices  # [K, b, R]
        row = torch.full((len(batch), num_heads), MAX_RANK)  # MAX_RANK: not among the top
        for k in range(num_heads):
            valid = states["rest"][batch] >= k + 1
            truth = torch.full((len(batch),), -2)
            truth[valid] = to_subset[states["next"][batch[valid] + k + 1]]  # -1 (never hit): outside the proposal vocabulary
            hit = top[k] == truth[:, None]
            row[hit.any(-1), k] = hit.float().argmax(-1)[hit.any(-1)]
        ranks.append(row)
    ranks = torch.cat(ranks)  # [N, K]
    by_rank = torch.stack([torch.bincount(ranks[:, k], minlength=MAX_RANK + 1)[:MAX_RANK] for k in range(num_heads)]) / len(ranks)
    return by_rank, count_paths(ranks.tolist(), MAX_RANK), len(ranks)


def count_paths(rows: list[list[int]], miss: int) -> Counter:
    """How often each rank path is right at every step, i.e. accepted by greedy verification: each
    row holds a position's rank at each step (`miss`: the true token not among them)."""
    paths = Counter()
    for row in rows:
        for depth in range(len(row)):
            if row[depth] == miss:
                break
            paths[tuple(row[: depth + 1])] += 1
    return paths


def best_tree(paths: Counter, size: int) -> list[list[int]]:
    """The `size` rank paths accepted most often: the tree of that size with the longest expected
    accepted length (each node adds its path's acceptance rate; a path is never more often right
    than its prefix, so parents come first)."""
    ranked = sorted(paths.items(), key=lambda item: (-item[1], len(item[0]), item[0]))
    return [list(path) for path, _ in ranked[:size]]


def expected_accept_length(paths: Counter, positions: int, tree: list[list[int]]) -> float:
    return sum(paths[tuple(path)] for path in tree) / positions


def train(args) -> dict:
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    if args.prompts:  # real prompts: the shards hold the target's hidden states already
        trained = functools.partial(distill.trained_by, args.start_from) if args.start_from else frozenset()
        data, train_ids, held_out = distill.ensure_split(args, args.distill_out, args.held_out, args.seed, trained)
    else:
        data, train_ids, held_out = load_split(args.data, args.sampled_data, args.temperature, args.held_out, args.seed, rng, args.varied_data)
    target = load_model("embedded", "bfloat16")
    lm_head = target.model.get_output_embeddings()
    proposal_vocab = draft_vocabulary(
        [data["sequences"][i] for i in train_ids], [data["answer_starts"][i] for i in train_ids], args.vocab_size, list(target.eos_token_ids)
    )
    start = time.time()
    proposal_weight = lm_head.weight[proposal_vocab].float()
    train_states = answer_states(target, data, train_ids, proposal_weight)
    eval_states = answer_states(target, data, held_out, proposal_weight)
    states_minutes = (time.time() - start) / 60
    lm_head.float()  # the heads train in float32 on the bfloat16 hidden states
    embedding = target.model.get_input_embeddings() if args.reads_token or args.reads_path else None  # tied to the LM head: float32 now too
    heads = MedusaHeads(target.model.config.hidden_size, target.model.config.vocab_size, args.heads, args.layers, lm_head, proposal_vocab, embedding,
                        args.reads_path)
    if args.start_from:  # fine-tune trained heads (their blocks, and their mixers if both read the token; the proposal vocabulary is this run's)
        heads.load_trained({name: tensor.float() for name, tensor in load_file(args.start_from / HEADS_FILE).items() if name != VOCAB_KEY})
    optimizer = torch.optim.AdamW(heads.parameters(), lr=args.lr, weight_decay=0.0)  # blocks and mixers: the shared head is a buffer
    positions = len(train_states["next"])
    steps_per_epoch = math.ceil(positions / args.batch)
    total = steps_per_epoch * args.epochs
    by_rank, _, _ = rank_paths(heads, eval_states, proposal_vocab)
    history = [{"epoch": 0, "top1": by_rank[:, 0].tolist(), "top5": by_rank[:, :5].sum(-1).tolist()}]
    schedule = Schedule(args.lr, 20, total, args.minutes)
    step, start = 0, time.time()
    for epoch in range(args.epochs):
        losses = []
        for batch in torch.randperm(positions).split(args.batch):
            if not schedule.begin_step(optimizer, step):
                break
            loss = soft_loss(heads, train_states, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            step += 1
            schedule.end_step()
        if not losses:
            break
        by_rank, _, _ = rank_paths(heads, eval_states, proposal_vocab)
        history.append({"epoch": epochs_done(epoch, len(losses), steps_per_epoch), "train_loss": sum(losses) / len(losses), "top1": by_rank[:, 0].tolist(), "top5": by_rank[:, :5].sum(-1).tolist()})
        print(json.dumps(history[-1]), f"{time.time() - start:.0f}s", flush=True)
    by_rank, paths, eval_positions = rank_paths(heads, eval_states, proposal_vocab)
    choices = best_tree(paths, args.tree_nodes)
    sizes = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64]
    heads.save(args.out, medusa_choices=choices, default_tree_size=args.tree_size, base_model="embedded SmolLM2-135M-Instruct")
    return {
        "history": history,
        "by_rank": by_rank.tolist(),
        "expected_tokens_per_pass": {n: 1 + expected_accept_length(paths, eval_positions, choices[:n]) for n in sizes if n <= len(choices)},
        "chain_tokens_per_pass": 1 + expected_accept_length(paths, eval_positions, [[0] * d for d in range(1, args.heads + 1)]),
        "tree": choices[: args.tree_size],
        "train_sequences": len(train_ids), "held_out_sequences": len(held_out),
        "train_positions": positions, "held_out_positions": eval_positions,
        "states_minutes": states_minutes, "train_minutes": (time.time() - start) / 60,
        **({"data_text": distill.describe(args.distill_out, data, train_ids),
                "trained_prompts": distill.chain_digests([data["prompts"][i] for i in train_ids], args.start_from),
                "distill_command": distill.command(args.distill_out, data)} if args.prompts else {}),
    }


def write_manifest(args, report: dict) -> None:
    final, first = report["history"][-1], report["history"][0]
    rows = "\n".join(f"| {k} (token {k + 2} ahead) | {first['top1'][k]:.3f} | {final['top1'][k]:.3f} | {final['top5'][k]:.3f} |" for k in range(args.heads))
    curve = "\n".join(f"| {h['epoch']} | {h['train_loss']:.3f} | {' / '.join(f'{a:.3f}' for a in h['top1'])} |" for h in report["history"][1:])
    expected = "\n".join(f"| {n} | {value:.2f} |" for n, value in report["expected_tokens_per_pass"].items())
    size = (args.out / "medusa_heads.safetensors").stat().st_size / 1e6
    start_text = (f" It fine-tunes the heads in `{args.start_from}` (`--start-from`; the commands of their manifest, kept in "
                  "`MANIFEST-start.md` here, made them), none of whose training prompts is held out here." if args.start_from else "")
    if args.prompts:
        command_text = f"""**Commands** (from a clean checkout, after `make setup`, with `../shared/train` beside it; docs/training.md):

    {report['distill_command']}
    .venv/bin/python -m training.train_medusa {' '.join(sys.argv[1:])}

The first answers the prompts into `{args.distill_out}/` shards that keep the target's hidden states (resumable;
docs/training.md gives its rate here); the second reads them ({report['states_minutes']:.0f} min here) and trains
({report['train_minutes']:.0f} min here, {distill.machine()}), seed {args.seed}.{start_text}"""
        data_text = report["data_text"] + f""" The greedy answers to {args.held_out} held-out prompts of the same plan
({report['held_out_positions']} positions) measure; nothing of them is trained on."""
    else:
        command_text = f"""**Command** (from a clean checkout, after `make setup`):

    .venv/bin/python -m training.train_medusa

It generates the draft's greedy self-distillation data into `build/selfdistill.pt` when missing (15 to 20 min here){SAMPLED_COMMAND if args.sampled_data else ""}{VARIED_COMMAND if args.varied_data else ""},
computes the target's hidden states ({report['states_minutes']:.0f} min here), then trains
({report['train_minutes']:.0f} min here, {distill.machine()}), seed {args.seed}."""
        data_text = f"""Self-distillation: the target's own greedy answers (bfloat16, at most 192 new tokens)
to the prompts `training/prompts.py` builds from our own
templates and word lists (writing, QA, explanations, coding, arithmetic, translation, summaries and
passage questions){SAMPLED_DATA_TEXT.format(args.temperature) if args.sampled_data else ""}{VARIED_DATA_TEXT if args.varied_data else ""}; no benchmark prompt. {report['train_sequences']} answers ({report['train_positions']} positions)
train; the greedy answers to {args.held_out} held-out prompts ({report['held_out_positions']} positions) measure."""
    (args.out / "MANIFEST.md").write_text(f"""# Medusa heads for the embedded SmolLM2-135M-Instruct

**What it is.** {args.heads} Medusa heads (Cai et al. 2024, Medusa-1): head k is {args.layers} residual
block(s) x + SiLU(W x + b) on {READS_PATH_TEXT if args.reads_path else READS_TOKEN_TEXT if args.reads_token else "the target's last hidden state"}, followed by the target's own LM head
(not stored here) restricted to the {args.vocab_size:,} tokens our answers use most (their ids are
stored with the heads: proposals come only from them; the target verifies with its full head).
Head k predicts the token k + 2 places ahead. `medusa_config.json` lists the {args.tree_nodes}
rank paths most often right on held-out answers, best first (`medusa_choices`); the static tree is
the first {args.tree_size} (`default_tree_size`), and any prefix of the list is a tree. `medusa` chooses
a tree of {args.tree_size} nodes afresh each pass by default (`tree="dynamic"`), by the heads' confidences.
Loaded by `specdemo.methods.medusa.load_heads(specdemo.assets.EMBEDDED_HEADS, target.model)`, no network.

{command_text}

**Data.** {data_text}
Loss: head k's cross-entropy against the target's own distribution for the token k + 2 ahead
(its top {TEACHER_TOP} tokens, renormalised), weighted 0.8^k; AdamW lr {args.lr}, cosine,
{args.epochs} epochs, batches of {args.batch} positions.

**Size.** `medusa_heads.safetensors` {size:.1f} MB.

**Measured on the held-out greedy answers** (teacher-forced, as decoding proposes; `training_report.json`):

| head | top-1 before | top-1 after | top-5 after |
| --- | --- | --- | --- |
{rows}

Tokens per target pass that greedy tree verification would commit there, by tree size (the
first n paths of `medusa_choices`; the top-1 chain of all heads: {report['chain_tokens_per_pass']:.2f}):

| tree nodes | tokens per pass |
| --- | --- |
{expected}

| epoch | train loss | held-out top-1 per head |
| --- | --- | --- |
{curve}

Speed on the benchmark prompts: `python -m specdemo.bench --methods ar,medusa` (docs/benchmarks.md).
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("build/selfdistill.pt"), help="greedy answers")
    parser.add_argument("--sampled-data", type=optional_path, default=SAMPLED_DATA,
                        help="answers sampled at --temperature to a second set of prompts (generated when missing); 'none': greedy answers only")
    parser.add_argument("--temperature", type=float, default=0.8, help="of the sampled answers")
    parser.add_argument("--varied-data", type=optional_path, default=None,
                        help="greedy answers to training/prompts_varied.py's prompts (generated when missing); 'none': leave them out")
    distill.add_arguments(parser)
    parser.add_argument("--distill-out", type=Path, default=distill.DEFAULT_OUT, help="the shards of `training.distill` for --prompts")
    parser.add_argument("--out", type=Path, default=EMBEDDED_HEADS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-from", type=Path, default=None, help="trained heads' folder: fine-tune them instead of starting afresh")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=1, help="residual blocks per head")
    parser.add_argument("--reads-token", action="store_true",
                        help="each head also reads the token its hidden state predicted (the last committed one), through a mixer in front of its blocks")
    parser.add_argument("--reads-path", action="store_true",
                        help="head k also reads the k tokens its tree path holds before its own (Hydra); implies --reads-token")
    parser.add_argument("--vocab-size", type=int, default=8192, help="tokens the heads propose from")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=1024, help="positions per training step")
    parser.add_argument("--minutes", type=float, default=None, help="train for this long at most, the learning rate decaying over it")
    parser.add_argument("--held-out", type=int, default=80)
    parser.add_argument("--tree-nodes", type=int, default=64, help="rank paths stored, best first")
    parser.add_argument("--tree-size", type=int, default=8,
                        help="nodes of the static and the dynamic tree (8: with the heads that read the token, 1.80x AR on 26 Spec-Bench questions against 1.60x for 12: git show 4f4c763:docs/methods/medusa.md)")
    args = parser.parse_args()
    selfdistill.on_default_device()
    report = train(args)
    report["args"] = {k: str(v) for k, v in vars(args).items()}
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.start_from:  # the commands that made the heads these started from
        (args.out / "MANIFEST-start.md").write_text(distill.start_manifest(args.start_from))
    write_manifest(args, report)
    print(json.dumps({"top1": report["history"][-1]["top1"], "expected_tokens_per_pass": report["expected_tokens_per_pass"]}))


if __name__ == "__main__":
    main()
