#!/bin/bash
# bench/seq.sh — `make bench-seq`: sequence parallel (docs/distributed.md §8) on the bench model
# (data/models/bench.json), one sequence of T tokens, stream, fast numerics: 2 processes x 1
# thread sharing it (--seq-ranks 2, and with --seq-overlap) against one process x 2 threads, in
# interleaved rounds. For each T: the step time of each (grad's "seconds", rank 0's), the ratios,
# the bytes and messages each rank sent against the planner's network model (plan --seq-ranks
# 2), the seconds each rank waited on the other, and the planned peaks.
#   bench/seq.sh BIN OUTDIR [T ...]   (default T: 8192; ROUNDS=2)
set -o pipefail
BIN=$(realpath "$1") OUT=$2
shift 2
TS=("${@:-8192}")
ROUNDS=${ROUNDS:-2}
mkdir -p "$OUT" || exit 2
M=$OUT/bench-model
[ -d "$M" ] || "$BIN" init --config data/models/bench.json --seed 1 --out "$M" >/dev/null || exit 1
MPI=(mpirun --oversubscribe --allow-run-as-root --mca btl self,vader)
secs() { sed -n 's/.*"seconds":[^0-9]*\([0-9.e+-]*\).*/\1/p' "$1" | head -1 | xargs printf '%.2f'; }
echo "sequence parallel, bench model, stream, fast numerics, $ROUNDS interleaved rounds" \
    "($(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
for T in "${TS[@]}"; do
    B=$OUT/seq-$T.safetensors # one row of T tokens, every one a target after the first 100
    [ -e "$B" ] || python3 -c '
import sys; sys.path.insert(0, "data"); import make_batches as mb
T = int(sys.argv[2]); u = mb.lcg(7)
mb.write(sys.argv[1], [mb.custom(u, T, "i" * 100 + "v" * (T - 100))], "I64")' "$B" "$T" || exit 1
    A=(grad --model "$M" --batch "$B" --schedule stream --json)
    one=() two=() ovl=()
    for r in $(seq "$ROUNDS"); do
        OMP_NUM_THREADS=2 "$BIN" "${A[@]}" --threads 2 --out "$OUT/one.st" >"$OUT/one-$T.json" \
            2>"$OUT/one-$T.log" || { tail -3 "$OUT/one-$T.log"; exit 1; }
        one+=("$(secs "$OUT/one-$T.json")")
        OMP_NUM_THREADS=1 "${MPI[@]}" -np 2 "$BIN" "${A[@]}" --threads 1 --seq-ranks 2 \
            --out "$OUT/two.st" >"$OUT/two-$T.json" 2>"$OUT/two-$T.log" ||
            { tail -3 "$OUT/two-$T.log"; exit 1; }
        two+=("$(secs "$OUT/two-$T.json")")
        OMP_NUM_THREADS=1 "${MPI[@]}" -np 2 "$BIN" "${A[@]}" --threads 1 --seq-ranks 2 \
            --seq-overlap --out "$OUT/two.st" >"$OUT/ovl-$T.json" 2>"$OUT/ovl-$T.log" ||
            { tail -3 "$OUT/ovl-$T.log"; exit 1; }
        ovl+=("$(secs "$OUT/ovl-$T.json")")
    done
    best() { printf '%s\n' "$@" | sort -g | head -1; }
    b1=$(best "${one[@]}") b2=$(best "${two[@]}") b3=$(best "${ovl[@]}")
    ratio() { awk -v a="$1" -v b="$b1" 'BEGIN { printf "%.2fx", a / b }'; }
    peak() { # the planned peak of the rank holding the most, MiB
        OMP_NUM_THREADS=1 "$BIN" plan --config data/models/bench.json --seq "$T" --schedules stream \
            "$@" --json | sed -n 's/.*"total":[^0-9]*\([0-9]*\).*/\1/p' |
            awk 'NR == 1 { printf "%.1f MiB", $1 / 1048576 }'
    }
    p1=$(peak) && p2=$(peak --seq-ranks 2) && p3=$(peak --seq-ranks 2 --seq-overlap) || exit 1
    echo "T = $T"
    echo "  1 process x 2 threads:                 ${one[*]} s (best $b1; peak $p1)"
    echo "  2 processes x 1 thread, --seq-ranks 2: ${two[*]} s (best $b2, $(ratio "$b2"); peak $p2)"
    echo "  the same with --seq-overlap:           ${ovl[*]} s (best $b3, $(ratio "$b3"); peak $p3)"
    grep -o 'sent per rank.*' "$OUT/two-$T.log" | sed 's/^/  last round: /'
    grep -o 'sent per rank.*' "$OUT/ovl-$T.log" | sed 's/^/  last round, --seq-overlap: /'
    # the planner's model of the rank sending the most, plus the start-up check's 5376 bytes in
    # one message to the other rank; --seq-overlap cuts the rows by work, so its own model
    model() { # LOG [PLAN ARGS...]
        local log=$1 want got
        shift
        want=$(OMP_NUM_THREADS=1 "$BIN" plan --config data/models/bench.json --seq "$T" \
            --schedules stream --seq-ranks 2 "$@" --json |
            sed -n 's/.*"sent_\(bytes\|messages\)_per_step":[^0-9]*\([0-9]*\).*/\2/p' |
            tr '\n' ' ') || return 1
        set -- $want
        got=$(grep -o 'sent per rank[^:]*: .*' "$log" | cut -d: -f2 | tr ' ' '\n' | grep / |
            awk -F/ '$1 > b { b = $1; m = $2 } END { print b - 5376, m - 1 }')
        [ "$got" = "$1 $2" ] && v="as sent" || v="SENT $got"
        echo "$1 bytes in $2 messages for the rank sending the most, besides the start-up check: $v"
    }
    m2=$(model "$OUT/two-$T.log") && m3=$(model "$OUT/ovl-$T.log" --seq-overlap) || exit 1
    echo "  model (plan --seq-ranks 2): $m2"
    echo "  model (plan --seq-ranks 2 --seq-overlap): $m3"
done
