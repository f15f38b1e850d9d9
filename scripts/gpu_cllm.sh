#!/usr/bin/env bash
# Make the CLLM's data and consistency-train it on one lent GPU, inside a fixed time budget:
#
#     bash scripts/gpu_cllm.sh RESULTS_DIR [SECONDS]
#
# The same four commands run on a CPU (the asset's manifest gives their rates there); only the batch
# sizes and the time budgets here are a GPU's. Chat prompts the target writes (`training.magpie`),
# its greedy answers to a plan of real prompts (`training.distill`), the Jacobi trajectories of those
# answers (`training.jacobi_trajectories --minutes`: the answers done when its time is spent; TRAJ_BATCH answers
# a pass, PARTS processes side by side, `--part`, joined by `--merge`) and the
# training (`training.train_cllm --minutes`, a step's 4 answers in one pass, then its held-out measurement and the
# quality check).
# RESULTS_DIR gets the log, the answers' tokens (`training.carry save`, to remake the shards anywhere),
# the chat prompts and each trained folder as a tar cut in pieces of 15 MB (a lent machine sends back
# files of at most 16 MiB): `cat cllm-ar10.tar.* | tar -x`.
# A smoke test on a CPU: TEMPLATES= HELD_OUT=6 MIN_ANSWER=8 MAGPIE=8 LIMIT=60 BATCH=16 MAX_NEW=24 ANSWERS=8 bash scripts/gpu_cllm.sh /tmp/r 60
set -u
RESULTS=${1:?results folder}
BUDGET=${2:-520}
PY=${PYTHON:-python3}
MAGPIE=${MAGPIE:-3000}
LIMIT=${LIMIT:-4000}          # answers in all, the 150 held out among them
BATCH=${BATCH:-1024}          # rows a batch, for the prompts and the answers
MAX_NEW=${MAX_NEW:-160}
ANSWERS=${ANSWERS:-4000}      # at most this many answers' trajectories (the time budget stops it sooner)
PARTS=${PARTS:-2}
TRAJ_BATCH=${TRAJ_BATCH:-32}  # answers iterated together a pass (`--batch-size`)
AR_WEIGHTS=${AR_WEIGHTS:-10 30}  # one CLLM each, trained side by side: the AR loss's weight keeps it near the base model
START=$(date +%s)
mkdir -p "$RESULTS" build
left() { echo $((BUDGET - ($(date +%s) - START))); }
say() { echo "[$(($(date +%s) - START))s] $*"; }

PROMPTS="../shared/train/gsm8k_train.jsonl ../shared/train/self_instruct.jsonl ../shared/train/t0_prompts.jsonl build/magpie.jsonl"
PLAN="--cap-per-source 20 --cap gsm8k=1500 self_instruct=1500 written_by_target=$MAGPIE ${TEMPLATES---templates} --limit $LIMIT"
SPLIT="--held-out ${HELD_OUT:-150} --min-answer ${MIN_ANSWER:-48} --seed 0 --answers $ANSWERS"

say "chat prompts"
timeout $((BUDGET * 8 / 100)) $PY -m training.magpie --count "$MAGPIE" --batch-size "$((BATCH * 3 / 2))" --out build/magpie.jsonl
say "$(wc -l < build/magpie.jsonl) chat prompts"
cp build/magpie.jsonl "$RESULTS/"

say "answers"
$PY -m training.distill --prompts $PROMPTS $PLAN --max-new-tokens "$MAX_NEW" \
    --shard-size "$BATCH" --batch-size "$BATCH" --batch-tokens $((BATCH * 400)) --out build/distill-cllm || exit 1
$PY -m training.carry save build/distill-cllm "$RESULTS/tokens.pt.xz"

TRAJ=$(awk "BEGIN {print ($(left) - 200) * 0.45 / 60}")
say "trajectories for $TRAJ minutes, $PARTS processes side by side, $TRAJ_BATCH answers a pass"  # one answer a pass waits on launches, not the GPU
for k in $(seq 0 $((PARTS - 1))); do
    OMP_NUM_THREADS=2 $PY -m training.jacobi_trajectories --prompts $PROMPTS $PLAN --distill-out build/distill-cllm $SPLIT \
        --part "$k/$PARTS" --batch-size "$TRAJ_BATCH" --out "build/jacobi-gpu.part$k.pt" --minutes "$TRAJ" > "build/jacobi-part$k.log" 2>&1 &
done
wait
tail -n 2 build/jacobi-part*.log
$PY -m training.jacobi_trajectories --prompts $PROMPTS $PLAN --distill-out build/distill-cllm $SPLIT \
    --merge build/jacobi-gpu.part*.pt --out build/jacobi-gpu.pt || exit 1
xz -T0 -3 -k -c build/jacobi-gpu.pt > "$RESULTS/jacobi-gpu.pt.xz"

TRAIN_MIN=$(awk "BEGIN {print ($(left) - 200) / 60}")  # loading, the measurements before and after and the quality check take the rest (over 2 min on the H200 of 2026-11-27)
say "training for $TRAIN_MIN minutes, AR weights $AR_WEIGHTS side by side"
for w in $AR_WEIGHTS; do
    OMP_NUM_THREADS=4 timeout $(($(left) + 60)) $PY -m training.train_cllm --prompts $PROMPTS $PLAN --distill-out build/distill-cllm $SPLIT \
        --trajectories build/jacobi-gpu.pt --ar-loss base --ar-weight "$w" --answers-a-pass 4 --epochs 50 --minutes "$TRAIN_MIN" --out "build/cllm-gpu-ar$w" \
        > "build/cllm-ar$w.log" 2>&1 &
done
wait
say "done"
for w in $AR_WEIGHTS; do
    grep -v -E "GGUF tensors|Loading weights" "build/cllm-ar$w.log"
    tar -cf - -C build "cllm-gpu-ar$w" | split -b 15000000 - "$RESULTS/cllm-ar$w.tar."
done
ls -la "$RESULTS"
