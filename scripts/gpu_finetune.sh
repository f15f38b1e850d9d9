#!/usr/bin/env bash
# Fine-tune the shipped feature draft on a lent GPU, from the answers an earlier GPU run carried
# back (`python -m training.carry save`: build/distill-gpu-tokens.pt.xz), in a fixed time:
#
#     bash scripts/gpu_finetune.sh RESULTS_DIR [MINUTES]
#
# It makes the shards again (`training.carry restore`: each feature from one target pass) and then
# trains, from assets/smollm2-135m-eagle for MINUTES (default 5), a draft that also reads the
# residual stream after the target's layers 2 and 15 (EAGLE-3's low and middle features:
# `train_eagle --layers`; LAYERS="" trains the draft as it is). RESULTS_DIR gets the trained
# folder as a tar and the logs. The same commands run on a CPU, slowly (docs/training.md);
# LIMIT=N restores the plan's first N answers only and EXTRA adds trainer flags (a smoke test:
# LIMIT=300 EXTRA="--train-limit 40").
set -u
RESULTS=${1:?results folder}
MINUTES=${2:-5}
PY=${PYTHON:-python3}
LIMIT=${LIMIT:-}
EXTRA=${EXTRA:-}
LAYERS=${LAYERS-2 15}
START=$(date +%s)
say() { echo "[$(($(date +%s) - START))s] $*"; }
mkdir -p "$RESULTS"

PLAN="--cap-per-source 20 --cap gsm8k=3000 self_instruct=2500 written_by_target=24000 --templates"
PROMPTS="../shared/train/gsm8k_train.jsonl ../shared/train/self_instruct.jsonl ../shared/train/t0_prompts.jsonl build/magpie.jsonl"

say "restoring the answers"
[ -f build/distill-gpu/plan.json ] ||  # a rerun on the same machine finds them
    $PY -m training.carry restore build/distill-gpu-tokens.pt.xz build/distill-gpu float32 $LIMIT > "$RESULTS/restore.log" 2>&1 || { tail -n 5 "$RESULTS/restore.log"; exit 1; }
say "training for $MINUTES minutes"
# One trainer with every core: two side by side, each with torch's default threads, took 150 s an
# epoch on an H200's 16 cores where one alone had taken about 18 s with one drafting step fewer
# (2026-11-26). `timeout` stops it (loading, the layers' features and evaluation take up to 5
# minutes beside the training); the trained folder is packed once it is written.
timeout $(( ${MINUTES%.*} * 60 + 300 )) $PY -m training.train_eagle --prompts $PROMPTS $PLAN --distill-out build/distill-gpu \
    --held-out 150 --start-from assets/smollm2-135m-eagle --epochs 40 --tt-epochs 40 --tt-steps 3 --lr 0.001 \
    --batch-tokens 16384 --minutes "$MINUTES" ${LAYERS:+--layers $LAYERS} $EXTRA --out build/eagle-gpu-ft > "$RESULTS/eagle.log" 2>&1
say "done"
tail -n 1 "$RESULTS/eagle.log"
[ -f build/eagle-gpu-ft/MANIFEST.md ] && tar -cf "$RESULTS/eagle-gpu-ft.tar" -C build eagle-gpu-ft
