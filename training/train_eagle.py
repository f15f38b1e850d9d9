"""Train the EAGLE feature draft for the embedded SmolLM2-135M-Instruct by self-distillation, on this CPU.

    python -m training.train_eagle        # target features, training, evaluation, assets/smollm2-135m-eagle/

The draft (`specdemo.methods.eagle.FeatureDraft`) reads pairs (f_t, x_{t+1}), the target's feature (its last
hidden state after the final norm) and the token that followed it, and predicts the next feature
f̂_{t+1}, which the target's own LM head turns into the token x_{t+2}. As in EAGLE (Li et al. 2024,
Sec. 4) it learns from the target's features directly: SmoothL1(f̂_{t+1}, f_{t+1}) + w_cls x the
cross-entropy of its token prediction against the target's next token, with uniform noise on the
input features. At decoding time it drafts on its own, imperfect, features; the last epochs can
also train those later steps ("training-time test", `--tt-epochs`). The data are the target's
greedy answers to our training prompts (training/selfdistill.py; never the bench prompts), the
token draft's held-out split (training/train_draft.py) and its vocabulary of K tokens. The target
runs once, in bfloat16 as the app runs it, to compute every feature; the draft trains in float32
and is stored in float16. Evaluated on held-out greedy answers: agreement of the first draft token,
and the tokens per target pass greedy speculative decoding gets when the draft runs γ steps.
Seeded; writes assets/smollm2-135m-eagle/ and its MANIFEST.md.
"""

import argparse
import functools
import hashlib
import json
import random
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import DynamicCache

from specdemo.assets import EMBEDDED_DRAFT, EMBEDDED_EAGLE
from specdemo.core.static import with_layers
from specdemo.methods.draft import load_draft
from specdemo.methods.eagle import (
    VOCAB_FILE,
    WEIGHTS_FILE,
    FeatureDraft,
    init_from_target,
    load_feature_draft,
    save_feature_draft,
)
from specdemo.models import load_model

from . import distill, selfdistill
from .eagle_manifest import CURVE_GAMMA, write_manifest
from .schedule import Schedule, epochs_done
from .selfdistill import draft_vocabulary, length_groups, load_split
from .train_draft import answer_positions, label_targets
from .train_draft import evaluate as evaluate_token_draft


@torch.inference_mode()
def target_features(decoder, sequences, indices, tokens_per_batch: int = 4096, layers: tuple[int, ...] = ()) -> dict[int, torch.Tensor]:
    """f for every position of each sequence: the decoder's last hidden state (after its final
    norm, what the LM head reads), [n, H] in the decoder's dtype; with `layers`, the residual
    stream after those layers before it, [n, (len(layers) + 1) * H] (`static.with_layers`).
    Right-padded batches need no mask: attention is causal, so a position never sees the padding after it."""
    features, start = {}, time.time()
    for count, group in enumerate(length_groups(sequences, indices, tokens_per_batch, None)):
        width = max(len(sequences[i]) for i in group)
        input_ids = torch.zeros(len(group), width, dtype=torch.long)
        for row, i in enumerate(group):
            input_ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
        hidden = with_layers(decoder(input_ids=input_ids.to(decoder.device), output_hidden_states=bool(layers)), layers)  # [B, T, H]
        for row, i in enumerate(group):
            features[i] = hidden[row, : len(sequences[i])].cpu().clone()
        if count % 20 == 0:
            print(f"  features: {len(features)}/{len(indices)} sequences, {time.time() - start:.0f}s", flush=True)
    return features


def pad_batch(data: dict, features: dict, group: list[int]):
    """(input_ids [B, T], mask [B, T], first_label [B], features [B, T, H] float32), right-padded."""
    sequences = data["sequences"]
    width = max(len(sequences[i]) for i in group)
    hidden = next(iter(features.values())).shape[-1]
    input_ids = torch.zeros(len(group), width, dtype=torch.long)
    mask = torch.zeros(len(group), width, dtype=torch.long)
    feats = torch.zeros(len(group), width, hidden)
    for row, i in enumerate(group):
        n = len(sequences[i])
        input_ids[row, :n] = torch.tensor(sequences[i])
        mask[row, :n] = 1
        feats[row, :n] = features[i].float()
    return input_ids, mask, torch.tensor([data["answer_starts"][i] - 1 for i in group]), feats


def eagle_loss(draft: FeatureDraft, input_ids, mask, first, feats, to_subset, w_cls: float, noise: float, steps: int = 1):
    """EAGLE's loss (Sec. 4) on the answer: SmoothL1(f̂_{t+1}, f_{t+1}) + w_cls · CE(q(f̂_{t+1}), x_{t+2}),
    from pairs (f_t + U(-noise, noise), x_{t+1}) for t over the whole sequence (causal, no cache).
    The cross-entropy is over the draft's vocabulary; a next token outside it counts for the
    regression only. With `steps` > 1 the draft also drafts on from every position on its own
    features, as decoding does (`drafted_features`), and each step's f̂_{t+1} is scored the same
    way ("training-time test": HASS, Zhang et al. 2024; EAGLE-3); the loss is the mean over steps.
    Returns (loss, regression, classification)."""
    noisy = feats + (torch.rand_like(feats) * 2 - 1) * noise if noise > 0 else feats
    if steps == 1:
        predicted = draft.features(noisy[:, :-1], input_ids[:, 1:], cache=None)[None]  # [1, B, T-1, H]: f̂_{t+1}
    else:
        predicted = drafted_features(draft, noisy, input_ids, steps)  # [steps, B, T-1, H]
    valid = answer_positions(mask, first)[:, 1:]  # [B, T-1]: f̂_{t+1} is read for an answer token x_{t+2}
    labels = label_targets(input_ids, mask, first, to_subset)[:, 1:][valid]  # x_{t+2} in the vocabulary, or -100
    wanted = feats[:, 1:, -predicted.shape[-1] :][valid]  # f_{t+1} (after the layers' residual stream, where there is one)
    regression = classification = 0.0
    for step in predicted:
        regression = regression + torch.nn.functional.smooth_l1_loss(step[valid], wanted) / steps
        classification = classification + torch.nn.functional.cross_entropy(draft.logits(step[valid]), labels, ignore_index=-100) / steps
    return regression + w_cls * classification, regression, classification


def autocast(dtype: str, device: torch.device):
    """The context a training step's forward runs in: `torch.autocast` to bfloat16 for `dtype`
    "bfloat16" (matrix products in bfloat16, the loss and the float32 master weights as they were),
    nothing for "none". On 2 cores of an AMD EPYC with AVX-512 BF16 a step of 8,192 tokens took
    0.87 s against 1.98 in float32 (one drafting step) and 2.54 against 6.36 (three)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def depth_mask(width: int, depth: int) -> torch.Tensor:
    """[1, 1, width, (depth + 1) * width] bool: what step `depth` of drafting attends to. Keys are
    the blocks of steps 0..depth laid end to end, each a row of positions 0..width-1; step 0 holds the
    true pairs. The step-`depth` entry at position t drafts from start p = t - depth + 1: it sees the
    true pairs at positions < p and, from each step e = 1..depth, the entry of the same start
    (position p + e - 1). Step 0 is plain causal attention."""
    t = torch.arange(width)[:, None]  # query positions
    block = torch.arange(depth + 1).repeat_interleave(width)[None]  # [1, K] step of each key
    s = torch.arange(width).repeat(depth + 1)[None]  # [1, K] position of each key
    true_pairs = (block == 0) & (s <= t - depth)
    same_start = (block >= 1) & (s == t - depth + block)
    return (true_pairs | same_start)[None, None]


def drafted_features(draft: FeatureDraft, feats: torch.Tensor, input_ids: torch.Tensor, depth: int) -> torch.Tensor:
    """[depth, B, T-1, H]: entry [d, b, t] is the feature f̂_{t+1} the draft predicts at drafting step
    d (0-based) from start p = t - d + 1, i.e. after the true pairs up to (f_{p-1}, x_p) and its own
    pairs (f̂_p, x_{p+1}), ..., (f̂_{t}, x_{t+1}), with the true tokens (those a draft step must have
    proposed to be accepted). All starts at once, one call per step: the KV cache holds the
    earlier steps and `depth_mask` picks, for each entry, the keys of its own start. Differentiable
    (training-time test); step 0 alone is `FeatureDraft.features` on the whole sequence."""
    width = input_ids.shape[1] - 1
    positions = torch.arange(width, device=input_ids.device)[None].expand(input_ids.shape[0], -1)
    cache = DynamicCache(config=draft.model.config)
    inputs, outputs = feats[:, :-1], []
    for d in range(depth):
        hidden = draft.model(
            inputs_embeds=draft.fuse(inputs, input_ids[:, 1:]),
            attention_mask=depth_mask(width, d).to(input_ids.device),
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state  # [B, T-1, H]
        outputs.append(hidden)
        inputs = torch.cat([torch.zeros_like(hidden[:, :1]), hidden[:, :-1]], dim=1)  # f̂ at t comes from t - 1
    return torch.stack(outputs)


@torch.no_grad()
def accepted_runs(draft: FeatureDraft, data: dict, features: dict, indices, to_subset, depth: int) -> list[list[int]]:
    """For each sequence, at each answer position p (p predicts the answer token p+1): how many of
    `depth` drafting steps from there greedy verification accepts, the draft running on its own
    features after the first step (teacher-forced only through the accepted tokens, which equal
    the target's)."""
    runs = []
    for group in length_groups(data["sequences"], indices, 4096, None):
        input_ids, mask, first, feats = pad_batch(data, features, group)
        feats = feats.to(draft.fc.weight.dtype)
        predicted = drafted_features(draft, feats, input_ids, depth)  # [D, B, T-1, H]
        valid = answer_positions(mask, first)[:, 1:]  # [B, T-1]
        labels = label_targets(input_ids, mask, first, to_subset)[:, 1:]  # [B, T-1]: x_{t+2}, -100 outside the vocabulary
        correct = torch.zeros(depth, *valid.shape, dtype=torch.bool)  # [D, B, T-1]
        for d in range(depth):
            correct[d][valid] = draft.logits(predicted[d][valid]).argmax(-1) == labels[valid]
        correct = correct.transpose(0, 1).tolist()  # [B][D][T-1]
        for row, i in enumerate(group):
            n, p0 = len(data["sequences"][i]), data["answer_starts"][i] - 1
            row_runs = []
            for p in range(p0, n - 1):
                run = 0  # step d from start p is entry t = p + d - 1; the last token x_{n-1} is read at t = n - 3
                while run < depth and p + run - 1 <= n - 3 and correct[row][run][p + run - 1]:
                    run += 1
                row_runs.append(run)
            runs.append(row_runs)
    return runs


def summarize(runs: list[list[int]], gammas) -> dict:
    """Agreement of the first draft token, acceptance rate by step (given the earlier steps
    accepted), and tokens per target pass for each γ, simulated as `train_draft.evaluate` does:
    a pass at position t drafts γ tokens, commits the accepted ones and the target's next token."""
    flat = [run for row in runs for run in row]
    result = {"top1_agreement": sum(run > 0 for run in flat) / len(flat), "eval_tokens": len(flat)}
    result["accept_rate_by_step"] = [
        sum(run > d for run in flat) / max(1, sum(run >= d for run in flat)) for d in range(max(gammas))
    ]
    for gamma in gammas:
        committed = passes = 0
        for row in runs:
            t = 0
            while t < len(row):
                run = min(row[t], gamma)
                committed += min(run + 1, len(row) - t)
                passes += 1
                t += run + 1
        result[f"tokens_per_pass_gamma{gamma}"] = committed / passes
    return result


def evaluate(draft, data, features, indices, to_subset, gammas) -> dict:
    draft.eval()
    start = time.time()
    result = summarize(accepted_runs(draft, data, features, indices, to_subset, max(gammas)), gammas)
    draft.train()
    return {**result, "eval_seconds": time.time() - start}


def initialise(draft: FeatureDraft, target, how: str) -> None:
    """`target`: `init_from_target` as is (the target's last layer, fc passing f_t through).
    `identity`: the same with the layer's two output projections zeroed, so that the draft starts
    as f̂_{t+1} = f_t, in the target's feature space. The last layer's writes are sized for the
    target's residual stream, far larger than a normalised feature: as is, the first f̂ are far off
    (initial cross-entropy about 89 nats) and training from there is slower."""
    init_from_target(draft, target)
    if how == "identity":
        with torch.no_grad():
            draft.model.layers[0].self_attn.o_proj.weight.zero_()
            draft.model.layers[0].mlp.down_proj.weight.zero_()


def checksum(module: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def train(args) -> dict:
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    clock = time.time()
    runner = load_model("embedded", "bfloat16")  # the target as the app runs it
    if args.prompts:  # real prompts: the shards hold the target's features already (not the layers')
        trained = functools.partial(distill.trained_by, args.start_from) if args.start_from else frozenset()
        data, train_ids, held_out = distill.ensure_split(args, args.distill_out, args.held_out, args.seed, trained)
        features = dict(enumerate(data.pop("features")))
    else:
        data, train_ids, held_out = load_split(args.data, args.sampled_data, args.temperature, args.held_out, args.seed, rng, args.varied_data)
    if args.train_limit:
        train_ids = train_ids[: args.train_limit]
    if args.prompts and args.vocab is None:  # the K tokens the real answers use most
        vocab = draft_vocabulary([data["sequences"][i] for i in train_ids], [data["answer_starts"][i] for i in train_ids],
                                 args.vocab_size, list(runner.eos_token_ids))
        args.vocab = args.out / VOCAB_FILE
        args.out.mkdir(parents=True, exist_ok=True)
        args.vocab.write_text(json.dumps(vocab.tolist()))
    args.vocab = args.vocab or EMBEDDED_DRAFT / VOCAB_FILE  # the token draft's: both drafts propose the same K tokens
    vocab = torch.tensor(json.loads(args.vocab.read_text()))
    to_subset = torch.full((49152,), -100, dtype=torch.long)
    to_subset[vocab] = torch.arange(len(vocab))
    if not args.prompts or args.layers:  # the target computes every feature, in one pass a sequence
        features = None  # (the shards' own, freed first)
        features = target_features(runner.model.get_decoder(), data["sequences"], train_ids + held_out,
                                   tokens_per_batch=65536 if runner.model.device.type == "cuda" else 4096, layers=tuple(args.layers))
    timings = {"features_minutes": (time.time() - clock) / 60}
    target = load_model("embedded", "float32").model  # the draft's shared embedding and LM head, float32, frozen
    target.requires_grad_(False)
    target_before = checksum(target)
    draft = FeatureDraft(target, vocab, tuple(args.layers))
    initialise(draft, target, args.init)
    if args.start_from:  # fine-tune a trained draft (its weights; the vocabulary is this run's; new layers' `reduce` as initialised)
        missing, unexpected = draft.load_state_dict({name: tensor.float() for name, tensor in load_file(args.start_from / WEIGHTS_FILE).items()}, strict=False)
        if unexpected or any(not name.startswith(("reduce.", "norms.")) for name in missing):
            raise SystemExit(f"--start-from {args.start_from}: another draft's weights (missing {missing}, unexpected {unexpected})")
    draft.train()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=args.lr, weight_decay=0.0)
    steps_per_epoch = len(length_groups(data["sequences"], train_ids, args.batch_tokens, None))
    total_steps = steps_per_epoch * args.epochs
    gammas = tuple(args.gammas)
    history = [{"step": 0, **evaluate(draft, data, features, held_out, to_subset, gammas)}]
    print(json.dumps(history[-1]), flush=True)
    schedule = Schedule(args.lr, 50, total_steps, args.minutes)
    step, clock = 0, time.time()
    for epoch in range(args.epochs):
        sums, epoch_clock, epoch_steps = [0.0, 0.0, 0.0], time.time(), 0
        tt = epoch >= args.epochs - args.tt_epochs or (args.minutes and schedule.progress(step) >= 1 - args.tt_epochs / args.epochs)
        steps = args.tt_steps if tt else 1
        for group in length_groups(data["sequences"], train_ids, args.batch_tokens, rng):
            if not schedule.begin_step(optimizer, step):
                break
            input_ids, mask, first, feats = pad_batch(data, features, group)
            with autocast(args.autocast, draft.fc.weight.device):
                loss, regression, classification = eagle_loss(draft, input_ids, mask, first, feats, to_subset, args.w_cls, args.noise, steps)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
            optimizer.step()
            for k, value in enumerate((loss, regression, classification)):
                sums[k] += value.item()
            step += 1
            epoch_steps += 1
            schedule.end_step()
            if step % 50 == 0:
                print(f"epoch {epoch} step {step}/{total_steps} loss {loss.item():.3f} {time.time() - clock:.0f}s", flush=True)
        if not epoch_steps:
            break
        last = epoch == args.epochs - 1 or schedule.done(step)
        eval_gammas = gammas if last else (CURVE_GAMMA,)
        history.append({"step": step, "epoch": epochs_done(epoch, epoch_steps, steps_per_epoch),
                        "steps_trained": steps, "train_loss": sums[0] / epoch_steps,
                        "train_smooth_l1": sums[1] / epoch_steps, "train_cross_entropy": sums[2] / epoch_steps,
                        "train_seconds": time.time() - epoch_clock, **evaluate(draft, data, features, held_out, to_subset, eval_gammas)})
        print(json.dumps(history[-1]), flush=True)
        if last:
            break
    if not all(f"tokens_per_pass_gamma{g}" in history[-1] for g in gammas):  # the budget ran out at an epoch's start
        history[-1].update(evaluate(draft, data, features, held_out, to_subset, gammas))
    timings["train_minutes"] = (time.time() - clock) / 60
    assert all(p.grad is None for p in target.parameters()) and checksum(target) == target_before, "the target changed"
    save_feature_draft(draft, args.out, {"base_model": "embedded SmolLM2-135M-Instruct", "w_cls": args.w_cls, "noise": args.noise})
    clock = time.time()
    saved = load_feature_draft(args.out, runner.model)  # as the app loads it: float16 on disk, bfloat16 here
    as_saved = evaluate(saved, data, features, held_out, to_subset, gammas)
    token_draft = compare_token_draft(data, held_out, gammas) if (EMBEDDED_DRAFT / VOCAB_FILE).exists() else None
    timings["final_eval_minutes"] = (time.time() - clock) / 60
    answers = torch.cat([torch.tensor(data["sequences"][i][data["answer_starts"][i]:]) for i in held_out])
    return {"history": history, "as_saved_bfloat16": as_saved, "token_draft_same_held_out": token_draft,
            "target_unchanged": True, "train_sequences": len(train_ids), "held_out_sequences": len(held_out),
            "train_positions": sum(len(data["sequences"][i]) - data["answer_starts"][i] for i in train_ids),
            "vocab_coverage_held_out": (to_subset[answers] >= 0).float().mean().item(), **timings,
            **({"data_text": distill.describe(args.distill_out, data, train_ids),
                "trained_prompts": distill.chain_digests([data["prompts"][i] for i in train_ids], args.start_from),
                "distill_command": distill.command(args.distill_out, data)} if args.prompts else {})}


def compare_token_draft(data: dict, held_out: list[int], gammas) -> dict:
    """The shipped token draft's numbers on the same held-out text, for comparison."""
    token_draft = load_draft("embedded", load_model("embedded", "float32"))
    token_vocab = torch.tensor(json.loads((EMBEDDED_DRAFT / VOCAB_FILE).read_text()))  # its head's rows
    token_subset = torch.full((49152,), -100, dtype=torch.long)
    token_subset[token_vocab] = torch.arange(len(token_vocab))
    return evaluate_token_draft(token_draft.model, token_draft.head, data, held_out, token_subset, gammas)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("build/selfdistill.pt"), help="greedy answers")
    parser.add_argument("--sampled-data", type=Path, default=None, help="sampled answers too (e.g. build/selfdistill-sampled.pt)")
    parser.add_argument("--temperature", type=float, default=0.8, help="of the sampled answers")
    parser.add_argument("--varied-data", type=Path, default=None, help="greedy answers to the varied prompts too (e.g. build/selfdistill-varied.pt)")
    parser.add_argument("--vocab", type=Path, default=None,
                        help="the token ids the draft proposes (default: with --prompts, the answers' most frequent; else the token draft's)")
    parser.add_argument("--vocab-size", type=int, default=8192)
    distill.add_arguments(parser)
    parser.add_argument("--distill-out", type=Path, default=distill.DEFAULT_OUT, help="the shards of `training.distill` for --prompts")
    parser.add_argument("--out", type=Path, default=EMBEDDED_EAGLE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=13)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--w-cls", type=float, default=0.1, help="weight of the token cross-entropy")
    parser.add_argument("--noise", type=float, default=0.1, help="half-width of the uniform noise on input features")
    parser.add_argument("--tt-epochs", type=int, default=3, help="the last epochs that also train later drafting steps")
    parser.add_argument("--tt-steps", type=int, default=2, help="drafting steps trained in those epochs")
    parser.add_argument("--init", choices=["target", "identity"], default="identity", help="see `initialise`")
    parser.add_argument("--start-from", type=Path, default=None, help="a trained feature draft's folder: fine-tune its weights instead")
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--held-out", type=int, default=80)
    parser.add_argument("--gammas", type=int, nargs="+", default=[3, 4, 5, 6, 8])
    parser.add_argument("--minutes", type=float, default=None,
                        help="train for this long at most, the learning rate decaying over it (and the last tt-epochs/epochs of it training later steps)")
    parser.add_argument("--autocast", choices=["none", "bfloat16"], default="none",
                        help="bfloat16: the draft's matrix products in bfloat16 while it trains (weights and optimizer stay float32; "
                             "2.3x to 2.5x faster on a CPU with AVX-512 BF16, see `autocast`)")
    parser.add_argument("--train-limit", type=int, default=None, help="train on the first N sequences only (for timing)")
    parser.add_argument("--layers", type=int, nargs="*", default=[],
                        help="the target layers whose residual stream the draft reads too (EAGLE-3: a low and a middle one, e.g. 2 15)")
    args = parser.parse_args()
    selfdistill.on_default_device()
    clock = time.time()
    report = train(args)
    report["total_minutes"] = (time.time() - clock) / 60
    report["args"] = {k: str(v) for k, v in vars(args).items()}
    (args.out / "training_report.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.start_from:  # the commands that made the draft this one started from
        (args.out / "MANIFEST-start.md").write_text(distill.start_manifest(args.start_from))
    write_manifest(args, report)
    print(json.dumps({k: report["history"][-1][k] for k in report["history"][-1] if k.startswith(("top1", "tokens_per_pass"))}))


if __name__ == "__main__":
    main()
