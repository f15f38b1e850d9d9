"""Consistency-train the embedded SmolLM2-135M-Instruct into a CLLM, on this CPU.

    python -m training.train_cllm      # trajectories (build/), training, measurement, assets/
    python -m training.train_cllm --prompts ../shared/train/*.jsonl --templates --distill-out build/distill-mix --ar-loss base

Kou et al. 2024, "CLLMs: Consistency Large Language Models". The data are Jacobi trajectories
of the target on its own greedy answers to our template prompts or, with `--prompts`, to real
prompts and a sampling plan (training/jacobi_trajectories.py).
Each step takes one answer and, for each of its blocks, one random state of the block's
trajectory short of the fixed point, and feeds them in one pass after the answer itself (each
state sees the answer before its block only). From that pass:

- the global consistency loss (Sec. 3.2, Eq. 4): at each position of a state from its first
  wrong token on, the cross-entropy from the model's distribution there to its distribution at
  the same position of the fixed point (the answer), the fixed-point side detached;
- the AR loss (Eq. 5) on the answer, label-smoothed by 0.1 and weighted 10 against the
  consistency loss, as the authors' training code does, so the model keeps the target's answers;
  or (`--ar-loss base`) the cross-entropy from the frozen base model's whole distribution at each
  answer position (the same model with its adapters off), which keeps the CLLM close to the base
  everywhere, not only at the greedy token.

With `--prompts` the CLLM is then checked against the base model on held-out real prompts
(training/cllm_quality.py) and the check is stored beside it (`quality.json`), in its manifest,
and shown by the app.

Low-rank adapters (LoRA, rank 32) on every attention and MLP projection train; the base stays
frozen in bfloat16, as decoding runs. Seeded; writes assets/smollm2-135m-cllm/ and its
MANIFEST.md, with tokens per Jacobi pass before and after on held-out prompts.
"""

import argparse
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from specdemo.assets import EMBEDDED_CLLM
from specdemo.core.attention import additive
from specdemo.core.events import final_summary
from specdemo.methods import jacobi
from specdemo.methods.cllm import ADAPTER_FILE, CONFIG_FILE, QUALITY_FILE, load_cllm
from specdemo.models import load_model

from . import distill, selfdistill
from .cllm_quality import check_quality, distinct_bigrams
from .jacobi_trajectories import block_positions, block_states_mask
from .schedule import Schedule

ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AR_WEIGHT = 10.0  # the authors' code: loss_ar *= 10
LABEL_SMOOTHING = 0.1


class LowRankAdapter(nn.Module):
    """y = W x + scale * B A x with W frozen (LoRA, Hu et al. 2021); B starts at zero, so the
    adapted model starts as the base model."""

    def __init__(self, base: nn.Linear, rank: int, scale: float):
        super().__init__()
        self.base, self.scale = base, scale
        self.lora_A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (self.scale * (x.float() @ self.lora_A.T) @ self.lora_B.T).to(x.dtype)


def add_adapters(model: nn.Module, rank: int, scale: float) -> dict[str, LowRankAdapter]:
    """Wrap every adapted projection of `model` in place; freeze everything else. Returns them by name."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    adapters = {}
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in ADAPTED:
            parent, child = name.rsplit(".", 1)
            adapters[name] = LowRankAdapter(module, rank, scale)
            setattr(model.get_submodule(parent), child, adapters[name])
    return adapters


def remove_adapters(model: nn.Module, adapters: dict[str, LowRankAdapter]) -> None:
    """Put the base projections back (the adapters are merged at load time instead)."""
    for name, adapter in adapters.items():
        parent, child = name.rsplit(".", 1)
        setattr(model.get_submodule(parent), child, adapter.base)


def adapter_tensors(adapters: dict[str, LowRankAdapter]) -> dict[str, torch.Tensor]:
    """The adapters in the format `specdemo.methods.cllm.merge_adapters` reads (float16: half the size;
    the merged weights are what the CLLM is, so its own AR is the reference either way)."""
    tensors = {}
    for name, adapter in adapters.items():
        tensors[f"{name}.lora_A"] = adapter.lora_A.detach().half().contiguous()
        tensors[f"{name}.lora_B"] = adapter.lora_B.detach().half().contiguous()
    return tensors


def pick_states(record: dict, rng: random.Random) -> list[tuple[int, list[int]]]:
    """One random non-final state per block (CLLM samples one point of the trajectory short of
    its fixed point), as (block start in the sequence, state); blocks with no such state are skipped."""
    picked = []
    for start, states in zip(record["block_starts"], record["states"]):
        if len(states) > 1:
            picked.append((record["answer_start"] + start, rng.choice(states[:-1])))
    return picked


def packed(segments: list[tuple[list[int], torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Several (tokens, allowed [n, n], positions [n]) segments as one row: tokens [1, T], the
    additive mask [1, 1, T, T] (block-diagonal: no segment sees another) and positions [1, T]."""
    tokens = torch.tensor([sum((tokens for tokens, _, _ in segments), [])])
    allowed = torch.block_diag(*(sees for _, sees, _ in segments))
    positions = torch.cat([positions for _, _, positions in segments])[None]
    return tokens, allowed, positions


@torch.no_grad()
def base_logits(model: nn.Module, adapters: dict[str, LowRankAdapter], records: list[dict]) -> list[torch.Tensor]:
    """The base model's logits at the positions that predict each record's answer: `model` with its
    adapters off, the records packed into one pass."""
    scales = {name: adapter.scale for name, adapter in adapters.items()}
    for adapter in adapters.values():
        adapter.scale = 0.0
    try:
        sequences = [record["sequence"] for record in records]
        tokens, allowed, positions = packed([(sequence, torch.ones(len(sequence), len(sequence), dtype=torch.bool).tril(),
                                              torch.arange(len(sequence))) for sequence in sequences])
        logits = model(tokens, attention_mask=additive(allowed, next(model.parameters()).dtype), position_ids=positions).logits[0].float()
        out, offset = [], 0
        for record, sequence in zip(records, sequences):
            out.append(logits[offset + record["answer_start"] - 1 : offset + len(sequence) - 1])
            offset += len(sequence)
        return out
    finally:
        for name, adapter in adapters.items():
            adapter.scale = scales[name]


def state_inputs(record: dict, picked: list[tuple[int, list[int]]]) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """One answer's sequence followed by its picked states: (tokens, allowed, positions), each state
    seeing the answer before its block only."""
    sequence = record["sequence"]
    context_length = len(sequence)
    ends, states = [end for end, _ in picked], [state for _, state in picked]
    lengths = [len(state) for state in states]
    causal = torch.ones(context_length, context_length, dtype=torch.bool).tril()
    allowed = torch.cat([
        torch.cat([causal, torch.zeros(context_length, sum(lengths), dtype=torch.bool)], dim=-1),
        block_states_mask(ends, lengths, context_length),
    ])
    positions = torch.cat([torch.arange(context_length), block_positions(ends, lengths)[0]])
    return sequence + sum(states, []), allowed, positions


def cllm_loss(model: nn.Module, record: dict, rng: random.Random, ar_weight: float = AR_WEIGHT,
              base: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """The CLLM loss of one answer (the module docstring), and its parts for the log. With `base`
    (`base_logits`), the AR loss is the cross-entropy from the base model's distribution."""
    return cllm_losses(model, [record], rng, ar_weight, None if base is None else [base])[0]


def cllm_losses(model: nn.Module, records: list[dict], rng: random.Random, ar_weight: float = AR_WEIGHT,
                bases: list[torch.Tensor] | None = None) -> list[tuple[torch.Tensor, dict]]:
    """`cllm_loss` of each record, the records packed into one pass (`packed`): the same losses as
    one pass each, in far fewer kernel launches (a GPU waits on those for one answer a pass)."""
    picks = [pick_states(record, rng) for record in records]
    segments = [state_inputs(record, picked) for record, picked in zip(records, picks)]
    tokens, allowed, positions = packed(segments)
    logits = model(tokens, attention_mask=additive(allowed, next(model.parameters()).dtype), position_ids=positions).logits[0].float()
    results, offset = [], 0
    for record, picked, (segment, _, _), base in zip(records, picks, segments, bases or [None] * len(records)):
        results.append(answer_loss(logits[offset : offset + len(segment)], record, picked, ar_weight, base))
        offset += len(segment)
    return results


def answer_loss(logits: torch.Tensor, record: dict, picked: list[tuple[int, list[int]]], ar_weight: float,
                base: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
    """The loss of one answer from its logits over `state_inputs`."""
    sequence, answer_start = record["sequence"], record["answer_start"]
    context_length = len(sequence)
    answer = torch.tensor(sequence[answer_start:])
    if base is None:
        ar_loss = nn.functional.cross_entropy(logits[answer_start - 1 : context_length - 1], answer, label_smoothing=LABEL_SMOOTHING)
    else:
        ar_loss = nn.functional.cross_entropy(logits[answer_start - 1 : context_length - 1], torch.softmax(base, dim=-1))

    student_rows, teacher_rows, row = [], [], context_length
    for end, state in picked:
        fixed_point = sequence[end : end + len(state)]
        first_wrong = next((i for i, (s, f) in enumerate(zip(state, fixed_point)) if s != f), len(state))
        # state token i predicts block token i + 1; before the first wrong token it sees what the
        # fixed point sees, so those positions teach nothing (as in CLLM's code)
        for i in range(first_wrong, len(state) - 1):
            student_rows.append(row + i)
            teacher_rows.append(end + i)
        row += len(state)
    if student_rows:
        teacher = torch.softmax(logits[teacher_rows].detach(), dim=-1)
        log_student = torch.log_softmax(logits[student_rows], dim=-1)
        consistency = -(teacher * log_student).sum(-1).mean()
        teacher_entropy = -(teacher * torch.log(teacher.clamp_min(1e-20))).sum(-1).mean()
    else:
        consistency = teacher_entropy = logits.new_zeros(())
    loss = consistency + ar_weight * ar_loss
    kl = (consistency - teacher_entropy).item()
    return loss, {"consistency_kl": kl, "ar": ar_loss.item(), "positions": len(student_rows)}


def train_adapters(model, records: list[dict], *, epochs: int, lr: float, accumulate: int, rank: int, scale: float,
                   seed: int, ar_weight: float = AR_WEIGHT, ar_loss: str = "answer", log_every: int = 50,
                   minutes: float | None = None, answers_a_pass: int = 1) -> tuple[dict, list[dict]]:
    """Train LoRA adapters on `records` with the CLLM loss (AdamW, warm-up then cosine decay over the
    epochs or, with `minutes`, over that much training time: `training.schedule`), `answers_a_pass`
    of each step's answers packed into one pass (`cllm_losses`: more on a GPU; on a CPU the packed
    pass's attention over all of them costs more than it saves);
    `ar_loss`: "answer" (the authors') or "base" (the module docstring).
    Returns the adapters (still wrapped into `model`) and the loss history."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    adapters = add_adapters(model, rank, scale)
    parameters = [p for adapter in adapters.values() for p in (adapter.lora_A, adapter.lora_B)]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    total_steps = math.ceil(len(records) / accumulate) * epochs
    schedule = Schedule(lr, 20, total_steps, minutes)
    history, window, step, start = [], [], 0, time.time()
    for epoch in range(epochs):
        order = list(range(len(records)))
        rng.shuffle(order)
        for first in range(0, len(order), accumulate):
            if not schedule.begin_step(optimizer, step):
                break
            optimizer.zero_grad()
            batch = order[first : first + accumulate]
            for pack in range(0, len(batch), answers_a_pass):
                group = [records[index] for index in batch[pack : pack + answers_a_pass]]
                bases = base_logits(model, adapters, group) if ar_loss == "base" else None
                losses = cllm_losses(model, group, rng, ar_weight, bases)
                (sum(loss for loss, _ in losses) / len(batch)).backward()
                window += [parts for _, parts in losses]
            optimizer.step()
            schedule.end_step()
            step += 1
            if step % log_every == 0 or step == total_steps or schedule.done(step):
                history.append({
                    "step": step, "epoch": epoch + 1, "minutes": (time.time() - start) / 60,
                    "consistency_kl": sum(p["consistency_kl"] for p in window) / len(window),
                    "ar": sum(p["ar"] for p in window) / len(window),
                })
                window = []
                print(json.dumps(history[-1]), flush=True)
        if schedule.done(step):
            break
    return adapters, history


def jacobi_passes(model, prompts_ids: list[torch.Tensor], max_new_tokens: int, block_size: int, eos: tuple[int, ...]) -> tuple[float, list[list[int]]]:
    """Tokens per Jacobi pass over `prompts_ids`, and the answers."""
    tokens = passes = 0
    answers = []
    for input_ids in prompts_ids:
        summary = final_summary(jacobi.generate(model, input_ids, max_new_tokens=max_new_tokens, block_size=block_size, eos_token_ids=eos))
        tokens, passes = tokens + len(summary.tokens), passes + summary.target_forwards
        answers.append(list(summary.tokens))
    return tokens / passes, answers


def trajectory_arguments(args) -> list[str]:
    """The `training.jacobi_trajectories` arguments that make the trajectories `args` asks for."""
    words = ["--out", str(args.trajectories), "--seed", str(args.seed), "--held-out", str(args.held_out),
             "--answers", str(args.answers), "--min-answer", str(args.min_answer)]
    if args.prompts:
        words += ["--prompts", *map(str, args.prompts), "--distill-out", str(args.distill_out), "--cap-per-source", str(args.cap_per_source),
                  "--cap", *args.cap, "--max-chars", str(args.max_chars), "--plan-seed", str(args.plan_seed),
                  *(["--limit", str(args.limit)] if args.limit else []), *(["--templates"] if args.templates else [])]
    return words


def load_trajectories(args) -> dict:
    """The trajectories at `args.trajectories`, collected first when missing (training/jacobi_trajectories.py)."""
    if not args.trajectories.exists():
        subprocess.run([sys.executable, "-m", "training.jacobi_trajectories", *trajectory_arguments(args)], check=True)
    return torch.load(args.trajectories)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    distill.add_arguments(parser)
    parser.add_argument("--distill-out", type=Path, default=distill.DEFAULT_OUT, help="the shards of `training.distill` for --prompts")
    parser.add_argument("--trajectories", type=Path, default=Path("build/jacobi_trajectories.pt"), help="made when missing")
    parser.add_argument("--held-out", type=int, default=80, help="prompts whose answers no trajectory comes from")
    parser.add_argument("--answers", type=int, default=360, help="answers whose trajectories train")
    parser.add_argument("--min-answer", type=int, default=1, help="only answers of at least this many tokens")
    parser.add_argument("--ar-loss", choices=("answer", "base"), default="answer",
                        help="answer: the authors' (the greedy answer, label-smoothed); base: the base model's distribution")
    parser.add_argument("--quality-prompts", type=int, default=50, help="held-out real prompts of the quality check (with --prompts)")
    parser.add_argument("--out", type=Path, default=EMBEDDED_CLLM)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--scale", type=float, default=2.0, help="LoRA alpha / rank")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--ar-weight", type=float, default=AR_WEIGHT, help=f"of the AR loss against the consistency loss ({AR_WEIGHT:g}: the authors' code)")
    parser.add_argument("--accumulate", type=int, default=4, help="answers per optimizer step")
    parser.add_argument("--eval-prompts", type=int, default=20, help="held-out prompts measured before and after")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--minutes", type=float, default=None, help="train for this long at most, the learning rate decaying over it")
    parser.add_argument("--answers-a-pass", type=int, default=1, help="answers packed into one pass (at most --accumulate; more on a GPU)")
    args = parser.parse_args()
    selfdistill.on_default_device()
    trajectories = load_trajectories(args)
    target = load_model("embedded", "bfloat16")
    eval_prompts = trajectories["held_out_prompts"][: args.eval_prompts]
    eval_ids = [target.encode_chat(prompt) for prompt in eval_prompts]
    block_size = trajectories["block_size"]
    before, base_answers = jacobi_passes(target.model, eval_ids, args.max_new_tokens, block_size, target.eos_token_ids)
    print(f"base: {before:.3f} tokens per Jacobi pass on {len(eval_ids)} held-out prompts", flush=True)

    model = target.model  # trained in place, its adapters removed below
    start = time.time()
    adapters, history = train_adapters(model, trajectories["records"], epochs=args.epochs, lr=args.lr,
                                       accumulate=args.accumulate, rank=args.rank, scale=args.scale, seed=args.seed, ar_weight=args.ar_weight,
                                       ar_loss=args.ar_loss, log_every=10, minutes=args.minutes, answers_a_pass=args.answers_a_pass)
    train_minutes = (time.time() - start) / 60
    tensors = adapter_tensors(adapters)
    remove_adapters(model, adapters)
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, args.out / ADAPTER_FILE)
    (args.out / CONFIG_FILE).write_text(json.dumps({"base_model": "embedded SmolLM2-135M-Instruct", "rank": args.rank, "scale": args.scale,
                                                    "modules": list(ADAPTED), "block_size": block_size}, indent=2) + "\n")
    cllm = load_cllm(args.out, target)
    after, cllm_answers = jacobi_passes(cllm, eval_ids, args.max_new_tokens, block_size, target.eos_token_ids)
    print(f"CLLM: {after:.3f} tokens per Jacobi pass", flush=True)
    report = {
        "history": history, "train_minutes": train_minutes, "tokens_per_pass_before": before, "tokens_per_pass_after": after,
        "eval_prompts": len(eval_ids), "block_size": block_size, "ar_weight": args.ar_weight,
        "distinct_bigrams_base": distinct_bigrams(base_answers), "distinct_bigrams_cllm": distinct_bigrams(cllm_answers), "answers_differing": sum(a != b for a, b in zip(base_answers, cllm_answers)),
        "train_answers": len(trajectories["records"]),
        "train_blocks": sum(len(r["block_starts"]) for r in trajectories["records"]),
        "examples": [{"prompt": p, "base": target.decode(a), "cllm": target.decode(b)} for p, a, b in zip(eval_prompts, base_answers, cllm_answers)],
    }
    if args.prompts:
        report["quality"] = check_quality(args, args.out, args.quality_prompts)
        print(json.dumps(report["quality"]), flush=True)
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    write_manifest(args, report, trajectories)


def write_manifest(args, report: dict, trajectories: dict) -> None:
    size = (args.out / ADAPTER_FILE).stat().st_size / 1e6
    curve = "\n".join(f"| {h['step']} | {h['epoch']} | {h['consistency_kl']:.3f} | {h['ar']:.3f} |" for h in report["history"])
    if args.prompts:
        command_text = f"""**Commands** (from a clean checkout, after `make setup`, with `../shared/train` beside it; docs/training.md):

    {trajectories['distill_command']}
    .venv/bin/python -m training.train_cllm {' '.join(sys.argv[1:])}

The first answers the prompts into `{args.distill_out}/` shards (resumable); the second collects the Jacobi
trajectories into `{args.trajectories}` when missing (`training.jacobi_trajectories`), trains
({report['train_minutes']:.0f} min here on {distill.machine()}), seed {args.seed}, measures and checks the result."""
    else:
        command_text = f"""**Command** (from a clean checkout, after `make setup`):

    .venv/bin/python -m training.train_cllm

It makes the greedy self-distillation answers (`build/selfdistill.pt`, 15 to 20 min here) and
the Jacobi trajectories (`build/jacobi_trajectories.pt`, about 17 min here) when missing, then
trains ({report['train_minutes']:.0f} min here on {distill.machine()}), seed {args.seed}."""
    if args.ar_loss == "base":
        ar_text = f"{args.ar_weight:g} x AR as the cross-entropy from the frozen base model's distribution at each answer position"
        ar_column = "AR (CE from the base)"
    else:
        ar_text = f"{args.ar_weight:g} x AR on the greedy answer (label smoothing {LABEL_SMOOTHING})"
        ar_column = "AR (smoothed CE)"
    quality = report.get("quality")
    if quality:
        bigrams, nll = quality["distinct_bigrams"], quality["base_nll_per_token"]
        quality_text = f"""**Is it still a good model?** (`training.cllm_quality`, `{QUALITY_FILE}`, shown by the app beside CLLM's answer.)
On {quality['prompts']} real prompts of the same sources that no asset trained on, both models answer greedily
({quality['dtype']}, {quality['max_new_tokens']} new tokens; {quality['answers_differ']} answers differ):

| | base model | CLLM | bound |
| --- | --- | --- | --- |
| distinct token bigrams per answer | {bigrams['base']:.3f} | {bigrams['cllm']:.3f} | at most {quality['bounds']['max_bigram_drop']} below the base |
| base model's NLL per answer token | {nll['base']:.3f} | {nll['cllm']:.3f} ({quality['nll_ratio']:.2f}x) | at most {quality['bounds']['max_nll_ratio']}x the base's |

{"Within both bounds." if quality["passes"] else "**Outside the bounds**: not to be shipped."}

"""
    else:
        quality_text = ""
    (args.out / "MANIFEST.md").write_text(f"""# CLLM adapters for the embedded SmolLM2-135M-Instruct

**What it is.** Low-rank adapters (LoRA rank {args.rank}, scale {args.scale}) on every attention and MLP
projection of the embedded SmolLM2-135M-Instruct, consistency-trained (Kou et al. 2024, CLLMs) so
that Jacobi decoding commits more tokens per pass. `specdemo.methods.cllm.load_cllm(EMBEDDED_CLLM, target)`
merges them into a copy of the target at load time, no network. The result is a changed model:
the `cllm` method's greedy answer equals AR on these merged weights, not the base model's AR.

{command_text}

**Data.** Jacobi trajectories (blocks of {report['block_size']} tokens, from `specdemo.methods.jacobi`'s first guess to the
fixed point) of {report['train_answers']} answers ({report['train_blocks']} blocks) of at least {trajectories.get('min_answer', 1)} tokens, drawn from:
{trajectories['data_text']} No benchmark prompt.
Loss: global consistency + {ar_text}, AdamW lr {args.lr},
warm-up and cosine, {args.epochs} epochs, {args.accumulate} answers per step.

**Size.** `{ADAPTER_FILE}` {size:.1f} MB (float16).

**Measured** on {report['eval_prompts']} held-out prompts of the training plan (not trained on), bfloat16, {args.max_new_tokens} new tokens,
Jacobi blocks of 16 (`training_report.json`):

| model | tokens per Jacobi pass |
| --- | --- |
| base SmolLM2-135M-Instruct | {report['tokens_per_pass_before']:.2f} |
| CLLM (these adapters) | {report['tokens_per_pass_after']:.2f} |

The CLLM's greedy answer differs from the base model's on {report['answers_differing']} of the {report['eval_prompts']} prompts.
Distinct token bigrams per answer (1: nothing repeats; a loop drives it toward 0): base
{report['distinct_bigrams_base']:.2f}, CLLM {report['distinct_bigrams_cllm']:.2f}. All answers are in `training_report.json`.

{quality_text}Loss curve (means over the steps since the previous row; consistency as KL to the fixed point's distribution):

| step | epoch | consistency KL | {ar_column} |
| --- | --- | --- | --- |
{curve}

Speed on the benchmark prompts: `python -m specdemo.bench --methods ar,jacobi,cllm` (docs/benchmarks.md).
""")


if __name__ == "__main__":
    main()
