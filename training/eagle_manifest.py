"""The MANIFEST.md that `training.train_eagle` writes beside the feature draft it trains: what the
draft is, the commands that made it, its data, its size and its measured numbers, from the
training report and the command's arguments."""

import json
import math
import sys

from . import distill

CURVE_GAMMA = 4  # the γ the per-epoch curve reports (every γ after the last epoch)


def write_manifest(args, report: dict) -> None:
    first, final, saved = report["history"][0], report["history"][-1], report["as_saved_bfloat16"]
    token = report["token_draft_same_held_out"] or {}  # none where the token draft was not there to compare (a GPU run's copy)
    sizes = "\n".join(f"| `{f.name}` | {f.stat().st_size / 1e6:.2f} MB |" for f in sorted(args.out.iterdir()) if f.name != "MANIFEST.md")
    rows = "\n".join(
        f"| {g} | {first[f'tokens_per_pass_gamma{g}']:.2f} | **{final[f'tokens_per_pass_gamma{g}']:.2f}** | {saved[f'tokens_per_pass_gamma{g}']:.2f} "
        f"| {token.get(f'tokens_per_pass_gamma{g}', math.nan):.2f} |" for g in args.gammas
    )
    curve = "\n".join(
        f"| {h['epoch']} | {h['steps_trained']} | {h['train_loss']:.3f} | {h['train_smooth_l1']:.3f} | {h['train_cross_entropy']:.3f} "
        f"| {h['top1_agreement']:.3f} | {h[f'tokens_per_pass_gamma{CURVE_GAMMA}']:.2f} | {h['train_seconds'] / 60:.1f} |" for h in report["history"][1:]
    )
    steps = " / ".join(f"{rate:.2f}" for rate in final["accept_rate_by_step"])
    minutes = report["features_minutes"] + report["train_minutes"] + report["final_eval_minutes"]
    layers_data = (f"The features, with the residual stream after layers {', '.join(map(str, args.layers))}, come from one bfloat16 pass of the "
                   "target over each whole sequence here (the data run's stored ones are the last layer's alone)." if args.layers else
                   "The features are the target's own, stored by the data run (float32 there, kept in bfloat16).")
    layers_text = (f" The first pair of each drafting step reads more of the target (EAGLE-3): the residual stream after its layers "
                   f"{', '.join(map(str, args.layers))}, each through an RMSNorm, joined with f_t and mapped to H by a linear layer "
                   f"(`reduce`, started as [0 ... 0 I]); later pairs read the draft's own f̂." if args.layers else "")
    vocab_text = "the tokens the training answers use most" if args.prompts else "the token draft's vocabulary, shared so the two propose the same tokens"
    start_line = f"\n    # then the commands of MANIFEST-start.md, which make {args.start_from}" if args.start_from else ""
    if args.prompts:
        command_text = f"""**Commands** (from a clean checkout, after `make setup`, with `../shared/train` beside it; docs/training.md):

    {report['distill_command']}{start_line}
    .venv/bin/python -m training.train_eagle {' '.join(sys.argv[1:])}

The first answers the prompts into `{args.distill_out}/` shards that keep the target's features (resumable;
docs/training.md gives its rate here); the second trains ({report['train_minutes']:.1f} min here on {distill.machine()},
evaluation after each epoch included, {report['features_minutes']:.1f} min of loading before), evaluates the saved draft
and, for comparison, the token draft ({report['final_eval_minutes']:.1f} min), seed {args.seed}, and writes this folder."""
        data_text = report["data_text"] + f""" The greedy answers to {args.held_out} held-out prompts
of the same plan ({report['held_out_sequences']} sequences, {final['eval_tokens']} positions) evaluate, and nothing of them is
trained on. {layers_data}"""
    else:
        command_text = f"""**Command** (from a clean checkout, after `make setup`; {minutes:.0f} minutes here on {distill.machine()}, plus the data):

    .venv/bin/python -m training.train_eagle

It generates the greedy self-distillation data into `build/selfdistill.pt` when missing
(`python -m training.selfdistill`, 15 to 20 min here), computes the target's features ({report['features_minutes']:.1f} min),
trains ({report['train_minutes']:.1f} min, evaluation after each epoch included), evaluates the saved draft and, for
comparison, the token draft ({report['final_eval_minutes']:.1f} min), seed {args.seed}, and writes this folder."""
        data_text = f"""Self-distillation: the target's own greedy answers (bfloat16, at most 192 new tokens)
to the prompts `training/prompts.py` builds from our own templates and word lists; no benchmark prompt.
{report['train_sequences']} sequences ({report['train_positions']} answer positions) train; the greedy answers to {args.held_out}
held-out prompts ({report['held_out_sequences']} sequences, {final['eval_tokens']} positions; the token draft's held-out split)
evaluate, and nothing of them is trained on. The features come from one bfloat16 pass of the target
over each whole sequence (prompt and answer), kept in memory in bfloat16."""
    (args.out / "MANIFEST.md").write_text(f"""# EAGLE feature draft for the embedded SmolLM2-135M-Instruct

**What it is.** A feature-level draft (EAGLE, Li et al. 2024; `specdemo.methods.eagle.FeatureDraft`): pair t,
the target's feature f_t (its last hidden state after the final norm) and the token x_(t+1) that
followed it, goes through fc([embed(x_(t+1)); f_t]) and one Llama decoder layer of the target's shape
to the predicted next feature f̂_(t+1); the target's own LM head, restricted to the {len(json.loads(args.vocab.read_text()))}
tokens of `draft_vocab.json` ({vocab_text};
{report['vocab_coverage_held_out']:.1%} of the held-out answer tokens), turns it into the next token. It drafts
further on its own features.{layers_text} {f"Fine-tuned from the draft in `{args.start_from}` (`--start-from`; the commands of its manifest, kept in `MANIFEST-start.md` here, made it), none of whose training prompts is held out here; the first draft of that chain was i" if args.start_from else "I"}nitialised from the target's last layer with fc passing f_t through
(`init_from_target`{", with the layer's output projections zeroed so that it starts as f̂_(t+1) = f_t" if args.init == "identity" else ""});
shares (and never changes) the target's embedding and LM head, which are not stored here.
Loaded by `specdemo.methods.eagle.load_feature_draft(folder, target)`, no network.

{command_text}

**Data.** {data_text}
Loss (EAGLE Sec. 4), on answer positions only: SmoothL1(f̂_(t+1), f_(t+1)) + {args.w_cls} x the cross-entropy
of the draft's token distribution (over its vocabulary) against the target's next token x_(t+2); inputs
are all pairs of each sequence (causal, in one pass), f_t with uniform noise U(-{args.noise}, {args.noise}) added.
{f"The last {args.tt_epochs} epochs also train drafting steps 2..{args.tt_steps} on the draft's own features (training-time test, HASS / EAGLE-3), the loss averaged over the steps. " if args.tt_epochs and args.tt_steps > 1 else ""}Draft in float32{" (its matrix products in bfloat16 while training: `--autocast bfloat16`)" if args.autocast == "bfloat16" else ""}; AdamW lr {args.lr}, 50 warm-up steps, cosine, gradient norm clipped at 0.5,
{args.epochs} epochs, batches of about {args.batch_tokens} tokens. Stored in float16.

**Size.**

| file | size |
| --- | --- |
{sizes}

**Measured on the held-out greedy answers** (`training_report.json` holds every number). Agreement: how often
the first draft token equals the target's next token. Tokens per target pass: greedy speculative decoding on that
text with γ draft steps, the draft running on its own features after the first step (the pass commits the
accepted draft tokens and the target's own next one), simulated as `training/train_draft.py` simulates the
token draft's. Before and after training in float32; "as saved": the stored float16 weights run in bfloat16 on
the bfloat16 target, as the app runs them; the token draft (assets/smollm2-135m-draft, float32, its own vocabulary) measured on the same text.

| | before | after | as saved | token draft |
| --- | --- | --- | --- | --- |
| first-token agreement | {first['top1_agreement']:.3f} | **{final['top1_agreement']:.3f}** | {saved['top1_agreement']:.3f} | {token.get('top1_agreement', math.nan):.3f} |

Tokens per target pass:

| γ | before | after | as saved | token draft |
| --- | --- | --- | --- | --- |
{rows}

Acceptance rate of draft step 1, 2, ... given the earlier ones were accepted (after training): {steps}.

| epoch | steps trained | train loss | SmoothL1 | cross-entropy | held-out agreement | tokens/pass γ={CURVE_GAMMA} | minutes |
| --- | --- | --- | --- | --- | --- | --- | --- |
{curve}

The target's weights are checked unchanged after training (checksum) and no gradient reaches them.
""")
