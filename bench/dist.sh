#!/bin/bash
# bench/dist.sh — `make bench-dist`: one process with 2 threads against 2 processes (mpirun) with
# 1 thread each, on the bench model (data/models/bench.json), 4 micro-batches a step of T tokens:
# step time, bytes sent per rank against the model of docs/distributed.md, the seconds each rank
# waited on the other, and whether the trained weights are the same bytes.
#   bench/dist.sh BIN OUTDIR [T] [STEPS]
set -o pipefail
BIN=$(realpath "$1") OUT=$2 T=${3:-512} STEPS=${4:-4}
mkdir -p "$OUT" || exit 2
M=$OUT/bench-model
[ -d "$M" ] || "$BIN" init --config data/models/bench.json --seed 1 --out "$M" >/dev/null || exit 1
J=$OUT/bench-$T.jsonl # 16 records of T random token ids below the vocabulary
awk -v T="$T" 'BEGIN { srand(7); for (r = 0; r < 16; r++) { s = "{\"input_ids\":[";
  for (t = 0; t < T; t++) s = s (t ? "," : "") int(rand() * 31990) + 5; print s "]}" } }' >"$J"
A="--model $M --jsonl $J --seq $T --batch-size 1 --grad-accum 4 --steps $STEPS --lr 1e-4"
rm -rf "$OUT/one" "$OUT/two"
OMP_NUM_THREADS=2 "$BIN" train $A --threads 2 --out "$OUT/one" >"$OUT/one.log" 2>&1 ||
    { tail -3 "$OUT/one.log"; exit 1; }
OMP_NUM_THREADS=1 mpirun --oversubscribe --allow-run-as-root --mca btl self,vader -np 2 \
    "$BIN" train $A --threads 1 --out "$OUT/two" >"$OUT/two.log" 2>&1 || { tail -3 "$OUT/two.log"; exit 1; }
# mean step time after the first step (which faults the buffers in)
mean() { awk -F, 'NR > 2 { s += $2; n++ } END { printf "%.3f", s / n }' "$1/timing.csv"; }
t1=$(mean "$OUT/one") t2=$(mean "$OUT/two")
# the planner's network model (docs/distributed.md §4): the bytes a step of the rank sending the
# most (pieces, losses, the clip norm's block sums, its updated weights), exact
S=$("$BIN" plan --config data/models/bench.json --seq "$T" --batch-size 1 --grad-accum 4 --ranks 2 \
    --optimizer --json 2>/dev/null | sed -n 's/.*"sent_bytes_per_step":[^0-9]*\([0-9]*\).*/\1/p' | head -1)
echo "bench model, T = $T, 4 micro-batches a step, $STEPS steps ($(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
echo "  1 process x 2 threads:  $t1 s a step"
echo "  2 processes x 1 thread: $t2 s a step ($(awk -v a="$t2" -v b="$t1" 'BEGIN { printf "%.2fx", a / b }'))"
grep -o 'sent per rank.*' "$OUT/two.log" | sed 's/^/  /'
[ -n "$S" ] && echo "  model: $((S * STEPS + 5376)) bytes for the rank sending the most over $STEPS steps (plan --ranks 2 --optimizer: $S a step, plus the start-up check's 5376)"
cmp -s "$OUT/one/model.safetensors" "$OUT/two/model.safetensors" && echo "  weights: the same bytes" ||
    echo "  weights: differ (fast numerics: 2 threads against 1 thread products; the fold itself is exact)"
