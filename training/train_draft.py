"""Train the draft for the embedded SmolLM2-135M-Instruct by self-distillation, on this CPU.

    python -m training.train_draft            # data (cached in build/), training, evaluation, assets/

The draft is two layers of the target's shape, initialised from the target's first two
layers, sharing (and never changing) the target's embedding and LM head. It learns to predict
the target's next token on the target's own answers to our training prompts (training/prompts.py),
greedy and sampled, scored over its vocabulary: the K tokens most frequent in those answers.
It is evaluated on the greedy answers to held-out prompts: greedy speculative decoding accepts a
draft token exactly when it equals the target's greedy choice.
Seeded; the result and its MANIFEST.md go to assets/smollm2-135m-draft/.
"""

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

from specdemo.assets import EMBEDDED_DRAFT
from specdemo.methods.draft import build_shared_draft, save_shared_draft
from specdemo.models import load_model

from .selfdistill import draft_vocabulary, length_groups, load_split


def batches(sequences, answer_starts, indices, tokens_per_batch: int, rng: random.Random):
    """Right-padded batches of similar length: (input_ids, attention_mask, first_label_position)."""
    for group in length_groups(sequences, indices, tokens_per_batch, rng):
        width = max(len(sequences[i]) for i in group)
        input_ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for row, i in enumerate(group):
            input_ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
            mask[row, : len(sequences[i])] = 1
        yield input_ids, mask, torch.tensor([answer_starts[i] - 1 for i in group])


def answer_positions(mask, first_label) -> torch.Tensor:
    """[B, T] True where position t predicts an answer token t+1 (not the prompt, not padding)."""
    positions = torch.arange(mask.shape[1])
    valid = (positions[None] >= first_label[:, None]) & (mask.roll(-1, dims=1) == 1)
    valid[:, -1] = False
    return valid


def label_targets(input_ids, mask, first_label, to_subset) -> torch.Tensor:
    """Labels [B, T]: the next token as an index into the draft vocabulary; -100 (ignored by
    the loss) off the answer and where the token is outside the vocabulary."""
    labels = to_subset[input_ids.roll(-1, dims=1)]
    return labels.masked_fill(~answer_positions(mask, first_label), -100)


def draft_logits(draft, head, input_ids, mask) -> torch.Tensor:
    hidden = draft.model(input_ids, attention_mask=mask).last_hidden_state  # [B, T, H]
    return hidden @ head.T  # [B, T, K]


@torch.no_grad()
def evaluate(draft, head, data, indices, to_subset, gammas=(3, 4, 5, 6, 8)) -> dict:
    """Top-1 agreement with the target's next token on held-out answers, and the tokens per
    target pass that greedy speculative decoding would get on them for each γ: with the target's
    greedy text as the prefix, a draft step accepts the run of consecutive agreements."""
    draft.eval()
    agree_flags = []
    for input_ids, mask, first in batches(data["sequences"], data["answer_starts"], indices, 4096, random.Random(0)):
        labels = label_targets(input_ids, mask, first, to_subset)  # outside the vocabulary: never agreed
        agree = draft_logits(draft, head, input_ids, mask).argmax(-1) == labels
        answer = answer_positions(mask, first)
        agree_flags += [agree[row][answer[row]].tolist() for row in range(input_ids.shape[0])]
    draft.train()
    total = sum(len(f) for f in agree_flags)
    result = {"top1_agreement": sum(sum(f) for f in agree_flags) / total, "eval_tokens": total}
    for gamma in gammas:
        committed = passes = 0
        for flags in agree_flags:
            t = 0
            while t < len(flags):
                run = 0
                while run < gamma and t + run < len(flags) and flags[t + run]:
                    run += 1
                committed += min(run + 1, len(flags) - t)
                passes += 1
                t += run + 1
        result[f"tokens_per_pass_gamma{gamma}"] = committed / passes
    return result


def train(args) -> dict:
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    data, train_ids, held_out = load_split(args.data, args.sampled_data, args.temperature, args.held_out, args.seed, rng)
    target = load_model("embedded", "float32", "cpu")
    for parameter in target.model.parameters():
        parameter.requires_grad_(False)
    vocab = draft_vocabulary(
        [data["sequences"][i] for i in train_ids], [data["answer_starts"][i] for i in train_ids], args.vocab_size, list(target.eos_token_ids)
    )
    to_subset = torch.full((49152,), -100, dtype=torch.long)
    to_subset[vocab] = torch.arange(len(vocab))
    draft = build_shared_draft(target.model, tuple(args.init_layers)).train()
    head = target.model.get_output_embeddings().weight[vocab]  # [K, H], frozen
    own = [p for name, p in draft.named_parameters() if name.startswith("model.layers.") or name == "model.norm.weight"]
    for p in own:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(own, lr=args.lr, weight_decay=0.0)
    steps_per_epoch = sum(1 for _ in batches(data["sequences"], data["answer_starts"], train_ids, args.batch_tokens, random.Random(0)))
    total_steps = steps_per_epoch * args.epochs
    history = [{"step": 0, **evaluate(draft, head, data, held_out, to_subset)}]
    print(json.dumps(history[-1]), flush=True)
    step, start, losses = 0, time.time(), []
    for epoch in range(args.epochs):
        for input_ids, mask, first in batches(data["sequences"], data["answer_starts"], train_ids, args.batch_tokens, rng):
            lr = args.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / total_steps))
            for group in optimizer.param_groups:
                group["lr"] = lr
            labels = label_targets(input_ids, mask, first, to_subset)
            logits = draft_logits(draft, head, input_ids, mask)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(own, 1.0)
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if step % 50 == 0:
                print(f"epoch {epoch} step {step}/{total_steps} loss {sum(losses[-50:]) / 50:.3f} {time.time() - start:.0f}s", flush=True)
        history.append({"step": step, "epoch": epoch + 1, "train_loss": sum(losses[-steps_per_epoch:]) / steps_per_epoch,
                        **evaluate(draft, head, data, held_out, to_subset)})
        print(json.dumps(history[-1]), flush=True)
    save_shared_draft(draft, vocab, args.out)
    coverage = vocab_coverage(data, held_out, to_subset)
    return {"history": history, "train_sequences": len(train_ids), "held_out_sequences": len(held_out),
            "train_answer_tokens": sum(len(data["sequences"][i]) - data["answer_starts"][i] for i in train_ids),
            "vocab_coverage_held_out": coverage, "minutes": (time.time() - start) / 60}


def vocab_coverage(data, indices, to_subset) -> float:
    answers = torch.cat([torch.tensor(data["sequences"][i][data["answer_starts"][i]:]) for i in indices])
    return (to_subset[answers] >= 0).float().mean().item()


def write_manifest(folder: Path, args, report: dict) -> None:
    final, first = report["history"][-1], report["history"][0]
    sizes = "\n".join(f"| `{f.name}` | {f.stat().st_size / 1e6:.1f} MB |" for f in sorted(folder.iterdir()) if f.name != "MANIFEST.md")
    gammas = [k.removeprefix("tokens_per_pass_gamma") for k in final if k.startswith("tokens_per_pass_gamma")]
    rows = "\n".join(f"| {g} | {first[f'tokens_per_pass_gamma{g}']:.2f} | {final[f'tokens_per_pass_gamma{g}']:.2f} |" for g in gammas)
    epochs = "\n".join(
        f"| {h['epoch']} | {h['train_loss']:.3f} | {h['top1_agreement']:.3f} |" for h in report["history"][1:]
    )
    (folder / "MANIFEST.md").write_text(f"""# Draft model for the embedded SmolLM2-135M-Instruct

**What it is.** The draft of `speculative` decoding for the embedded target: {args.num_layers} transformer layers
of the target's shape and a final norm (initialised from target layers {args.init_layers} and its norm),
sharing the target's token embedding and LM head (not stored here; taken from the target at load time).
It proposes tokens from its vocabulary of the {args.vocab_size} token ids most frequent in the training answers
(`draft_vocab.json`; they cover {report['vocab_coverage_held_out']:.1%} of the held-out answer tokens).
Loaded by `specdemo.methods.draft.load_draft("embedded", target)`, no network.

**Command** (from a clean checkout, after `make setup`; about {report['minutes'] + 25:.0f} minutes on 2 CPU cores):

    .venv/bin/python -m training.train_draft

It generates the data when `build/selfdistill*.pt` are missing (`python -m training.selfdistill`), trains
(seed {args.seed}), evaluates and writes this folder.

**Data.** Self-distillation: the target's own answers (bfloat16, at most 192 new tokens), greedy and sampled at
temperature {args.temperature}, to the prompts that `training/prompts.py` builds from our own templates and word
lists (writing, QA, explanations, coding, arithmetic, translation, plus summarization and passage questions around
50 passages the target wrote). No benchmark prompt (ours or Spec-Bench's) is used. {report['train_sequences']}
sequences ({report['train_answer_tokens']} answer tokens) train; the greedy answers to {args.held_out} held-out prompts
({report['held_out_sequences']} sequences) evaluate, and no answer to those prompts is trained on.
Loss: cross-entropy of the draft's prediction over its vocabulary against the target's next token, on answer
positions only. AdamW, lr {args.lr}, cosine, {args.epochs} epochs, batches of about {args.batch_tokens} tokens.

**Size.**

| file | size |
| --- | --- |
{sizes}

**Measured on the held-out answers** (teacher-forced; `training_report.json` holds every number):
top-1 agreement with the target {first['top1_agreement']:.3f} before training, **{final['top1_agreement']:.3f} after**,
over {final['eval_tokens']} tokens. Tokens per target pass that greedy speculative decoding gets on that text:

| γ | before | after |
| --- | --- | --- |
{rows}

| epoch | train loss | held-out top-1 agreement |
| --- | --- | --- |
{epochs}

Speed on the benchmark prompts: `python -m specdemo.bench --methods ar,speculative,hf_assisted` (docs/benchmarks.md).
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("build/selfdistill.pt"), help="greedy answers")
    parser.add_argument("--sampled-data", type=Path, default=Path("build/selfdistill-sampled.pt"), help="sampled answers")
    parser.add_argument("--temperature", type=float, default=0.8, help="of the sampled answers")
    parser.add_argument("--out", type=Path, default=EMBEDDED_DRAFT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init-layers", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--held-out", type=int, default=80)
    args = parser.parse_args()
    report = train(args)
    args.num_layers = len(args.init_layers)
    (args.out / "training_report.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **report}, indent=2) + "\n")
    write_manifest(args.out, args, report)
    print(json.dumps(report["history"][-1]))


if __name__ == "__main__":
    main()
