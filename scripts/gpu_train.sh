#!/usr/bin/env bash
# Make the self-distillation data and train the feature draft and the Medusa heads on one GPU,
# inside a fixed time budget (a lent GPU comes for minutes, not hours):
#
#     bash scripts/gpu_train.sh RESULTS_DIR [SECONDS]
#
# The same commands run on a CPU (docs/training.md gives their rates there); only the batch sizes
# and the time budgets here are a GPU's. Each stage stops at its share of SECONDS (default 480):
# the chat prompts (`training.magpie`) after a batch, the answers (`training.distill`) after a whole
# shard, so what it leaves is a valid prefix of its plan, and the two trainers, run side by side,
# by `--minutes`. RESULTS_DIR gets the two trained folders, the prompts the target wrote, the
# answers' tokens (no features: `training.carry`) and the log.
set -u
RESULTS=${1:?results folder}
BUDGET=${2:-480}
PY=${PYTHON:-python3}
MAGPIE=${MAGPIE:-24000}
BATCH=${BATCH:-2048}           # rows a batch, for the prompts and the answers
HELD_OUT=${HELD_OUT:-150}
EXTRA=${EXTRA:-}               # more flags for training.distill (a smoke test: "--limit 40 --max-new-tokens 16")
START=$(date +%s)
mkdir -p "$RESULTS" build
left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "[$(($(date +%s) - START))s] $*"; }

PLAN="--cap-per-source 20 --cap gsm8k=3000 self_instruct=2500 written_by_target=$MAGPIE --templates"
PROMPTS="../shared/train/gsm8k_train.jsonl ../shared/train/self_instruct.jsonl ../shared/train/t0_prompts.jsonl build/magpie.jsonl"

say "chat prompts"
timeout $((BUDGET * 12 / 100)) $PY -m training.magpie --count "$MAGPIE" --batch-size "$BATCH" --out build/magpie.jsonl
say "$(wc -l < build/magpie.jsonl) chat prompts"

say "answers"
timeout $(($(left) - BUDGET * 45 / 100)) $PY -m training.distill --prompts $PROMPTS $PLAN --max-new-tokens 160 \
    --shard-size "$BATCH" --batch-size "$BATCH" --batch-tokens $((BATCH * 400)) --out build/distill-gpu $EXTRA
say "$(ls build/distill-gpu/shard-*.pt | wc -l) shards"

TRAIN=$(awk "BEGIN {print ($(left) - 100) / 60}")  # minutes each trainer may train: loading, evaluation and writing take the rest
say "training for $TRAIN minutes"
$PY -m training.train_eagle --prompts $PROMPTS $PLAN --distill-out build/distill-gpu --held-out "$HELD_OUT" --epochs 6 \
    --tt-epochs 3 --tt-steps 3 --batch-tokens 16384 --minutes "$TRAIN" --out build/eagle-gpu > "$RESULTS/eagle.log" 2>&1 &
$PY -m training.train_medusa --prompts $PROMPTS $PLAN --distill-out build/distill-gpu --held-out "$HELD_OUT" --epochs 4 \
    --batch 8192 --minutes "$TRAIN" --out build/medusa-gpu > "$RESULTS/medusa.log" 2>&1 &
$PY -m training.carry save build/distill-gpu "$RESULTS/tokens.pt.xz"
cp build/magpie.jsonl "$RESULTS/"
wait
say "done"
tail -n 3 "$RESULTS/eagle.log" "$RESULTS/medusa.log"
tar -cf "$RESULTS/eagle-gpu.tar" -C build eagle-gpu
tar -cf "$RESULTS/medusa-gpu.tar" -C build medusa-gpu
