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
#
# START=assets fine-tunes the shipped feature draft and Medusa heads instead of training afresh
# (the draft reading the target's layers LAYERS too, default "2 15": EAGLE-3's low and middle
# features, docs/training.md), so one call of a lent GPU makes the answers again and improves both:
#
#     START=assets bash scripts/gpu_train.sh RESULTS 540
#
# The two trainers share the machine's cores half and half (each with all of them, side by side,
# an epoch took 8 times as long on an H200's 16 cores, 2026-11-26).
set -u
RESULTS=${1:?results folder}
BUDGET=${2:-480}
PY=${PYTHON:-python3}
MAGPIE=${MAGPIE:-24000}
BATCH=${BATCH:-2048}           # rows a batch, for the prompts and the answers
HELD_OUT=${HELD_OUT:-150}
EXTRA=${EXTRA:-}               # more flags for training.distill (a smoke test: "--limit 40 --max-new-tokens 16")
START=${START:-}               # "assets": fine-tune the shipped draft and heads
LAYERS=${LAYERS-2 15}          # with START=assets, the target layers the draft also reads ("" for none)
SLACK=${SLACK:-100}            # seconds left to the trainers' loading, evaluation and writing (their --minutes counts steps only)
THREADS=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
BEGAN=$(date +%s)
mkdir -p "$RESULTS" build
left() { echo $((BUDGET - ($(date +%s) - BEGAN))); }
say() { echo "[$(($(date +%s) - BEGAN))s] $*"; }

PLAN="--cap-per-source 20 --cap gsm8k=3000 self_instruct=2500 written_by_target=$MAGPIE --templates"
PROMPTS="../shared/train/gsm8k_train.jsonl ../shared/train/self_instruct.jsonl ../shared/train/t0_prompts.jsonl build/magpie.jsonl"

say "chat prompts"
timeout $((BUDGET * 12 / 100)) $PY -m training.magpie --count "$MAGPIE" --batch-size "$BATCH" --out build/magpie.jsonl
say "$(wc -l < build/magpie.jsonl) chat prompts"

say "answers"
timeout $(($(left) - BUDGET * 45 / 100)) $PY -m training.distill --prompts $PROMPTS $PLAN --max-new-tokens 160 \
    --shard-size "$BATCH" --batch-size "$BATCH" --batch-tokens $((BATCH * 400)) --out build/distill-gpu $EXTRA
say "$(ls build/distill-gpu/shard-*.pt | wc -l) shards"

TRAIN=$(awk "BEGIN {print ($(left) - $SLACK) / 60}")  # minutes each trainer may train: loading, evaluation and writing take the rest
if [ "$START" = assets ]; then  # fine-tunes: as many epochs as the minutes allow, the learning rate decaying over them
    EAGLE="--start-from assets/smollm2-135m-eagle ${LAYERS:+--layers $LAYERS} --epochs 40 --tt-epochs 40 --tt-steps 3 --lr 0.001"
    MEDUSA="--start-from assets/smollm2-135m-medusa --reads-token --epochs 40"
else
    EAGLE="--epochs 6 --tt-epochs 3 --tt-steps 3"
    MEDUSA="--epochs 4"
fi
say "training for $TRAIN minutes, $THREADS threads each"
OMP_NUM_THREADS=$THREADS $PY -m training.train_eagle --prompts $PROMPTS $PLAN --distill-out build/distill-gpu --held-out "$HELD_OUT" \
    $EAGLE --batch-tokens 16384 --minutes "$TRAIN" --out build/eagle-gpu > "$RESULTS/eagle.log" 2>&1 &
OMP_NUM_THREADS=$THREADS $PY -m training.train_medusa --prompts $PROMPTS $PLAN --distill-out build/distill-gpu --held-out "$HELD_OUT" \
    $MEDUSA --batch 8192 --minutes "$TRAIN" --out build/medusa-gpu > "$RESULTS/medusa.log" 2>&1 &
$PY -m training.carry save build/distill-gpu "$RESULTS/tokens.pt.xz"
cp build/magpie.jsonl "$RESULTS/"
wait
say "done"
tail -n 3 "$RESULTS/eagle.log" "$RESULTS/medusa.log"
tar -cf "$RESULTS/eagle-gpu.tar" -C build eagle-gpu
tar -cf "$RESULTS/medusa-gpu.tar" -C build medusa-gpu
