#!/bin/bash
# mpi_ranks.sh — the distributed step under mpirun (docs/distributed.md, its tests): the gradient file
# of `mpirun -np N streambp grad` with 12 micro-batches is the same bytes (the loss in its metadata
# included) as one process without a launcher, for N = 1..4, across schedules, tied and untied
# heads, DPO, GRPO, LoRA, bf16 storage and fp64; N not dividing the micro-batches exits 2 on every
# rank (train: before its run directory is begun); a build without MPI under `mpirun -np 2` exits 2
# (NOMPI=path of such a binary, optional); a rank killed or stopped at the first, a middle or the
# last bucket ends the job with the first error (exit 3 naming a silent peer), for every family
# under grad and train, with the faults build of tests/faults.c (FAULTS, default beside STREAMBP:
# tests/streambp-faults).
#
#   STREAMBP=build/streambp FAULTS=build/tests/streambp-faults [NOMPI=build-nompi/streambp] \
#       tests/mpi_ranks.sh
#
# Run by `make test` when the build has MPI. Every mpirun runs under timeout; one test = one line.
cd "$(dirname "$0")/.." || exit 2
BIN=$(realpath "${STREAMBP:-build/streambp}")
TMP=$(mktemp -d) || exit 2
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/tmp" && export TMPDIR=$TMP/tmp # where ranks > 0 of train keep their private runs
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
# Open MPI's dlopen'd components leak a little at exit, in frames no suppression matches
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
MPIRUN=(timeout 60 mpirun --oversubscribe --allow-run-as-root --mca btl self,vader)
fails=0 runs=0

ok() { runs=$((runs + 1)); echo "ok   $*"; }
bad() { runs=$((runs + 1)) fails=$((fails + 1)); echo "FAIL $*"; }

model() { # family [extra init args] -> directory
    local d=$TMP/model-$1
    [ -d "$d" ] || "$BIN" init --config "data/models/$1.json" --seed 1 --out "$d" >/dev/null ||
        { echo "FAIL init $1"; exit 1; }
    echo "$d"
}

# Twelve small SFT micro-batches (the suite's batches, each a few rows of T <= 32).
SFT=""
for f in sft-tiny suite-chunk-starts-on-ignored suite-left-padding suite-right-padding \
    suite-single-target suite-t22 suite-target-from-padding-2 suite-target-from-padding \
    suite-unattended-left-pad suite-unequal-rows suite-left-padding sft-tiny; do
    SFT="$SFT --batch data/batches/$f.safetensors"
done

# same NAME "RANKS" ARGS...: one process without mpirun, then mpirun -np N for each N: cmp.
# With SEQ=1 in its environment each N also shares every sequence (--seq-ranks N, §8); an entry
# N:S runs N processes as N / S groups of S sharing each sequence (--seq-ranks S).
same() {
    local name=$1 ranks=$2 tag
    shift 2
    local want=$TMP/$name-1p.safetensors
    if ! timeout 120 "$BIN" grad "$@" --threads 1 --out "$want" >"$TMP/log" 2>&1; then
        bad "$name: one process failed: $(tail -1 "$TMP/log")"
        return
    fi
    for n in $ranks; do
        local got=$TMP/$name-${n/:/x}.safetensors extra=() np=${n%%:*} sr=${n#*:}
        tag="N=$n"
        [ "${SEQ:-0}" = 1 ] && extra=(--seq-ranks "$sr") tag="--seq-ranks $sr"
        [ "$np" != "$sr" ] && tag="N = $np as $((np / sr)) x $sr, $tag"
        "${MPIRUN[@]}" -np "$np" "$BIN" grad "$@" --threads 1 "${extra[@]}" --out "$got" \
            >"$TMP/log" 2>&1
        local rc=$?
        if [ $rc != 0 ]; then
            bad "$name $tag: exit $rc ($(grep -m1 streambp "$TMP/log"))"
        elif cmp -s "$want" "$got"; then
            ok "$name $tag: the same bytes as one process"
        else
            bad "$name $tag: the gradient file differs from one process's"
        fi
    done
}

L=$(model llama3-tiny) Q=$(model qwen3-tiny) Q2=$(model qwen2-tiny)
P="--numerics portable"
same llama-stream "1 2 3 4" --model "$L" $SFT $P --schedule stream --chunk 7 --block 4
same qwen3-tied-stream "2 3 4" --model "$Q" $SFT $P --schedule stream --chunk 7 --logit-chunk 5 --block 4
same qwen3-tied-full "2 4" --model "$Q" $SFT $P --schedule full
same llama-ckpt "3" --model "$L" $SFT $P --schedule ckpt --chunked-logits --logit-chunk 3
same llama-fast "2 3" --model "$L" $SFT --schedule stream --chunk 7
same qwen2-fp64 "3" --model "$Q2" $SFT $P --precision fp64
same llama-bf16 "2 3" --model "$L" $SFT $P --precision bf16
DPO="--batch data/batches/dpo-tiny.safetensors --batch data/batches/dpo-tiny.safetensors"
DPO="$DPO --batch data/batches/dpo-tiny.safetensors --objective dpo --beta 0.1"
same qwen2-dpo-sigmoid "3" --model "$Q2" $DPO $P
same qwen2-dpo-ipo "3" --model "$Q2" $DPO $P --loss-type ipo
GRPO="--objective grpo --beta 0.04 --temperature 0.7 --epsilon-high 0.28"
for f in grpo-tiny grpo-clip grpo-ragged; do GRPO="$GRPO --batch data/batches/$f.safetensors"; done
for lt in grpo bnpo dr_grpo dapo; do
    same "qwen3-grpo-$lt" "3" --model "$Q" $GRPO $P --loss-type $lt
done
A=$TMP/adapter
"$BIN" lora init --model "$Q" --r 2 --targets q_proj,v_proj,down_proj --seed 3 --b-std 0.05 \
    --out "$A" >/dev/null 2>&1 || bad "lora init"
[ -d "$A" ] && same qwen3-lora "2 3" --model "$Q" --lora "$A" $SFT $P

# plan --ranks N: the planned peak of the rank holding the most equals the largest measured
# per-rank ledger peak, to the byte (12 micro-batches of one shape; one thread: the workspaces
# are per thread)
BB="--batch data/batches/sft-tiny.safetensors"
B12="$BB $BB $BB $BB $BB $BB $BB $BB $BB $BB $BB $BB"
for s in stream full; do
    x=""
    [ $s = stream ] && x="--chunk 7 --logit-chunk 5"
    for n in 2 3 4; do
        "${MPIRUN[@]}" -np $n "$BIN" grad --model "$L" $B12 --threads 1 --block 4 --schedule $s $x \
            --out "$TMP/gplan.st" >"$TMP/log" 2>&1
        got=$(sed -n 's/.*ledger peak of the rank holding the most: \([0-9]*\) bytes/\1/p' "$TMP/log")
        want=$("$BIN" plan --config data/models/llama3-tiny.json --seq 24 --batch-size 2 --block 4 \
            --schedules $s $x --grad-accum 12 --ranks $n --json 2>&1 |
            sed -n 's/.*"total":[^0-9]*\([0-9]*\).*/\1/p' | head -1)
        [ -n "$got" ] && [ "$got" = "$want" ] && ok "plan --ranks $n ($s): $want bytes, as measured" ||
            bad "plan --ranks $n ($s): planned ${want:-?}, measured ${got:-?}"
        [ $s = full ] && continue
        # the network model: the rank sending the most, its bytes and messages (the pieces, the
        # losses, its share to rank 0's file; the start-up check's all-gather of 5376 bytes, one
        # message to each peer, taken off)
        got=$(grep -o 'sent per rank[^:]*: .*' "$TMP/log" | cut -d: -f2 | tr ' ' '\n' | grep / |
            awk -F/ -v n=$n '$1 > b { b = $1; m = $2 } END { print b - 5376 * (n - 1), m - (n - 1) }')
        want=$("$BIN" plan --config data/models/llama3-tiny.json --seq 24 --batch-size 2 --block 4 \
            --schedules $s $x --grad-accum 12 --ranks $n --json 2>&1 |
            sed -n 's/.*"sent_\(bytes\|messages\)_per_step":[^0-9]*\([0-9]*\).*/\2/p' | tr '\n' ' ')
        [ "$got " = "$want" ] && ok "plan --ranks $n: the network model, $got bytes/messages, as sent" ||
            bad "plan --ranks $n: network model ${want:-?}, sent ${got:-?}"
    done
done

# train: 6 steps of 12 micro-batches; the weights, a checkpoint's weights and moments and the loss
# log are the bytes of one process (trainer_state.json differs only in timing.csv's hash: wall
# time), for every N and schedule, LoRA, and resumed on another N.
TRAIN="--jsonl data/train/counting.jsonl --seq 32 --batch-size 1 --grad-accum 12 --steps 6 --lr 1e-2"
TRAIN="$TRAIN --warmup-steps 2 --shuffle --weight-decay 0.01 --block 8 --logit-chunk 8 --threads 1"
FILES="model.safetensors loss.csv checkpoint-3/model.safetensors checkpoint-3/optimizer.safetensors"
train_same() { # name dir-of-reference run-dir
    local f
    for f in $FILES; do
        [ -e "$3/${f/model.safetensors/adapter_model.safetensors}" ] && f=${f/model.safetensors/adapter_model.safetensors}
        if ! cmp -s "$2/$f" "$3/$f"; then
            bad "$1: $f differs from one process's"
            return
        fi
    done
    ok "$1: weights, checkpoint and loss log are one process's bytes"
}
train_ref() { # name [args] -> reference run directory of one process
    local d=$TMP/train-$1-1p
    shift
    timeout 120 "$BIN" train "$@" --save-every 3 --out "$d" >"$TMP/log" 2>&1 ||
        bad "train reference: $(grep -m1 streambp "$TMP/log")"
    echo "$d"
}
R=$(train_ref stream --model "$Q" $TRAIN --schedule stream --chunk 16)
for n in 2 3 4; do
    "${MPIRUN[@]}" -np $n "$BIN" train --model "$Q" $TRAIN --schedule stream --chunk 16 \
        --save-every 3 --out "$TMP/train-$n" >"$TMP/log" 2>&1 || bad "train N=$n: $(grep -m1 streambp "$TMP/log")"
    train_same "train N=$n" "$R" "$TMP/train-$n"
    grep -q "streambp train: $n processes; sent per rank" "$TMP/log" &&
        ok "train N=$n ran as $n processes that exchanged pieces" || bad "train N=$n: no exchange reported"
    # rank 0 alone reports the data loader's notes; the checkpoint records the process count
    [ "$(grep -c 'records truncated to 32 tokens' "$TMP/log")" = 1 ] &&
        grep -q "\"ranks\":[[:space:]]*$n," "$TMP/train-$n/checkpoint-3/trainer_state.json" &&
        ok "train N=$n: one truncation note (rank 0's), trainer_state.json says ranks $n" ||
        bad "train N=$n: $(grep -c 'records truncated' "$TMP/log") truncation notes, or no \"ranks\": $n"
done
# plan --ranks N --optimizer: a train step's peak on the rank holding the most (the weights, the
# gradient, the moments of its blocks only: ZeRO-2) equals the largest measured per-rank ledger
# peak to the byte; the network model (pieces, losses, the clip norm's block sums, the updated
# weights) equals what the rank sending the most sent in 2 steps (no checkpoint), start-up check off
TP="--seq 32 --batch-size 1 --grad-accum 12 --block 8 --logit-chunk 8 --schedule stream --chunk 16"
declare -A PEAK # the measured per-rank peaks, N = 1..4 (one process: its timing.csv's ledger peak)
timeout 120 "$BIN" train --model "$Q" --jsonl data/train/counting.jsonl $TP --steps 2 --lr 1e-2 \
    --threads 1 --out "$TMP/tplan-1" >"$TMP/log" 2>&1
PEAK[1]=$(tail -1 "$TMP/tplan-1/timing.csv" 2>/dev/null | cut -d, -f4)
for n in 2 3 4; do
    "${MPIRUN[@]}" -np $n "$BIN" train --model "$Q" --jsonl data/train/counting.jsonl $TP \
        --steps 2 --lr 1e-2 --threads 1 --out "$TMP/tplan-$n" >"$TMP/log" 2>&1
    got=$(sed -n 's/.*ledger peak of the rank holding the most: \([0-9]*\) bytes/\1/p' "$TMP/log")
    PEAK[$n]=$got
    "$BIN" plan --config data/models/qwen3-tiny.json ${TP/--schedule/--schedules} --optimizer \
        --ranks $n --json >"$TMP/plan" 2>&1
    want=$(sed -n 's/.*"total":[^0-9]*\([0-9]*\).*/\1/p' "$TMP/plan" | head -1)
    [ -n "$got" ] && [ "$got" = "$want" ] && ok "plan --ranks $n --optimizer: $want bytes, as a train step measured" ||
        bad "plan --ranks $n --optimizer: planned ${want:-?}, measured ${got:-?}"
    got=$(grep -o 'sent per rank[^:]*: .*' "$TMP/log" | cut -d: -f2 | tr ' ' '\n' | grep / |
        awk -F/ -v n=$n '$1 > b { b = $1; m = $2 } END { print (b - 5376 * (n - 1)) / 2, (m - (n - 1)) / 2 }')
    want=$(sed -n 's/.*"sent_\(bytes\|messages\)_per_step":[^0-9]*\([0-9]*\).*/\2/p' "$TMP/plan" | tr '\n' ' ')
    [ "$got " = "$want" ] && ok "plan --ranks $n --optimizer: the network model of a train step, $got bytes/messages, as sent" ||
        bad "plan --ranks $n --optimizer: network model ${want:-?}, sent ${got:-?} a step"
done
# ZeRO-2's point: a rank holds less than one process, and less the more ranks there are. No rank
# holds a whole gradient (the step's result is its share, the pieces pass through a ring of two
# buckets and a column of one bucket's share): a whole-slab buffer anywhere breaks these
# (docs/distributed.md §7)
echo "train peaks (qwen3-tiny, 12 micro-batches; bytes): N=1 ${PEAK[1]}, N=2 ${PEAK[2]}, N=3 ${PEAK[3]}, N=4 ${PEAK[4]}"
for n in 2 3 4; do
    [ -n "${PEAK[1]}" ] && [ -n "${PEAK[$n]}" ] && [ "${PEAK[$n]}" -lt "${PEAK[1]}" ] &&
        ok "train N=$n: a rank's peak ${PEAK[$n]} < one process's ${PEAK[1]}" ||
        bad "train N=$n: a rank's peak ${PEAK[$n]:-?} is not below one process's ${PEAK[1]:-?}"
done
[ -n "${PEAK[4]}" ] && [ -n "${PEAK[2]}" ] && [ "${PEAK[4]}" -lt "${PEAK[2]}" ] &&
    [ "${PEAK[3]}" -lt "${PEAK[2]}" ] && ok "train: a rank's peak falls with N (${PEAK[2]}, ${PEAK[3]}, ${PEAK[4]})" ||
    bad "train: a rank's peak does not fall with N (${PEAK[2]:-?}, ${PEAK[3]:-?}, ${PEAK[4]:-?})"
# the checkpoint's gather and the resume's read hold one tensor at a time (charged to the ledger):
# with a checkpoint every step, and resumed from it, a rank's peak is still the step's, as planned
"${MPIRUN[@]}" -np 2 "$BIN" train --model "$Q" --jsonl data/train/counting.jsonl $TP --steps 2 \
    --lr 1e-2 --threads 1 --save-every 1 --stop-at 1 --out "$TMP/tck" >"$TMP/log" 2>&1 &&
    "${MPIRUN[@]}" -np 2 "$BIN" train --model "$Q" --jsonl data/train/counting.jsonl $TP --steps 2 \
        --lr 1e-2 --threads 1 --save-every 1 --resume "$TMP/tck" --out "$TMP/tck" >"$TMP/log2" 2>&1
got=$(sed -n 's/.*ledger peak of the rank holding the most: \([0-9]*\) bytes/\1/p' "$TMP/log")
got2=$(sed -n 's/.*ledger peak of the rank holding the most: \([0-9]*\) bytes/\1/p' "$TMP/log2")
[ -n "$got" ] && [ "$got" = "${PEAK[2]}" ] && [ "$got2" = "${PEAK[2]}" ] &&
    ok "train N=2 saving every step, then resumed: peak $got, the step's (the gathers stay below it)" ||
    bad "train N=2 saving every step / resumed: peaks ${got:-?} / ${got2:-?}, the step's ${PEAK[2]:-?}"
for s in full ckpt; do
    "${MPIRUN[@]}" -np 3 "$BIN" train --model "$Q" $TRAIN --schedule $s --save-every 3 \
        --out "$TMP/train-$s" >"$TMP/log" 2>&1 || bad "train $s: $(grep -m1 streambp "$TMP/log")"
    train_same "train $s N=3" "$R" "$TMP/train-$s"
done
# resumed on another N: 2 then 3, 4 then 1 (no launcher)
"${MPIRUN[@]}" -np 2 "$BIN" train --model "$Q" $TRAIN --save-every 3 --stop-at 3 --out "$TMP/res23" \
    >"$TMP/log" 2>&1 && "${MPIRUN[@]}" -np 3 "$BIN" train --model "$Q" $TRAIN --save-every 3 \
    --out "$TMP/res23" --resume "$TMP/res23" >"$TMP/log" 2>&1 || bad "resume 2 -> 3: $(grep -m1 streambp "$TMP/log")"
train_same "train N=2 stopped at 3, resumed with N=3" "$R" "$TMP/res23"
"${MPIRUN[@]}" -np 4 "$BIN" train --model "$Q" $TRAIN --save-every 3 --stop-at 3 --out "$TMP/res41" \
    >"$TMP/log" 2>&1 && timeout 120 "$BIN" train --model "$Q" $TRAIN --save-every 3 \
    --out "$TMP/res41" --resume "$TMP/res41" >"$TMP/log" 2>&1 || bad "resume 4 -> 1: $(grep -m1 streambp "$TMP/log")"
train_same "train N=4 stopped at 3, resumed in one process" "$R" "$TMP/res41"
if [ -d "$A" ]; then
    RL=$(train_ref lora --model "$Q" --lora "$A" $TRAIN)
    "${MPIRUN[@]}" -np 3 "$BIN" train --model "$Q" --lora "$A" $TRAIN --save-every 3 \
        --out "$TMP/train-lora" >"$TMP/log" 2>&1 || bad "train LoRA: $(grep -m1 streambp "$TMP/log")"
    train_same "train LoRA N=3" "$RL" "$TMP/train-lora"
fi
# train --seq-ranks: the ranks sharing every sequence (T = 300) write one process's bytes, and a
# run resumes on another S (2 -> 3) and from sequence parallel to data parallel (3 -> N = 2)
STR="--jsonl data/train/counting.jsonl --seq 300 --batch-size 1 --grad-accum 2 --steps 4 --lr 1e-2"
STR="$STR --warmup-steps 1 --block 8 --chunk 40 --threads 1"
RS=$(train_ref seq --model "$Q" $STR)
"${MPIRUN[@]}" -np 2 "$BIN" train --model "$Q" $STR --seq-ranks 2 --save-every 3 \
    --out "$TMP/train-seq2" >"$TMP/log" 2>&1 || bad "train --seq-ranks 2: $(grep -m1 streambp "$TMP/log")"
train_same "train --seq-ranks 2" "$RS" "$TMP/train-seq2"
"${MPIRUN[@]}" -np 2 "$BIN" train --model "$Q" $STR --seq-ranks 2 --save-every 3 --stop-at 3 \
    --out "$TMP/res-s23" >"$TMP/log" 2>&1 && "${MPIRUN[@]}" -np 3 "$BIN" train --model "$Q" $STR \
    --seq-ranks 3 --save-every 3 --out "$TMP/res-s23" --resume "$TMP/res-s23" >"$TMP/log" 2>&1 ||
    bad "resume --seq-ranks 2 -> 3: $(grep -m1 streambp "$TMP/log")"
train_same "train --seq-ranks 2 stopped at 3, resumed with --seq-ranks 3" "$RS" "$TMP/res-s23"
"${MPIRUN[@]}" -np 3 "$BIN" train --model "$Q" $STR --seq-ranks 3 --save-every 3 --stop-at 3 \
    --out "$TMP/res-s3n2" >"$TMP/log" 2>&1 && "${MPIRUN[@]}" -np 2 "$BIN" train --model "$Q" $STR \
    --save-every 3 --out "$TMP/res-s3n2" --resume "$TMP/res-s3n2" >"$TMP/log" 2>&1 ||
    bad "resume --seq-ranks 3 -> N = 2: $(grep -m1 streambp "$TMP/log")"
train_same "train --seq-ranks 3 stopped at 3, resumed as data parallel N = 2" "$RS" "$TMP/res-s3n2"
# ... and as 2 groups of 2 (N = 4, a micro-batch a group), resumed from there on 3 ranks sharing
# each sequence; its rank's peak is the plan's (train's: AdamW's moments of its share, the
# step's column; one thread, as the plan's attention form assumes with OMP_NUM_THREADS=1)
"${MPIRUN[@]}" -np 4 "$BIN" train --model "$Q" $STR --seq-ranks 2 --save-every 3 \
    --out "$TMP/train-seq22" >"$TMP/log" 2>&1 || bad "train N = 4 as 2 x 2: $(grep -m1 streambp "$TMP/log")"
train_same "train N = 4 as 2 groups of 2 (--seq-ranks 2)" "$RS" "$TMP/train-seq22"
got=$(sed -n 's/.*ledger peak of the rank holding the most: \([0-9]*\) bytes/\1/p' "$TMP/log")
want=$(OMP_NUM_THREADS=1 "$BIN" plan --config data/models/qwen3-tiny.json --seq 300 --grad-accum 2 \
    --ranks 4 --seq-ranks 2 --optimizer --block 8 --chunk 40 --schedules stream --json |
    sed -n 's/.*"total":[^0-9]*\([0-9]*\).*/\1/p' | head -1)
[ -n "$got" ] && [ "$got" = "$want" ] && ok "plan --ranks 4 --seq-ranks 2 --optimizer: $want bytes, as train measured" ||
    bad "plan --ranks 4 --seq-ranks 2 --optimizer: planned ${want:-?}, train measured ${got:-?}"
"${MPIRUN[@]}" -np 4 "$BIN" train --model "$Q" $STR --seq-ranks 2 --save-every 3 --stop-at 3 \
    --out "$TMP/res-g22" >"$TMP/log" 2>&1 && "${MPIRUN[@]}" -np 3 "$BIN" train --model "$Q" $STR \
    --seq-ranks 3 --save-every 3 --out "$TMP/res-g22" --resume "$TMP/res-g22" >"$TMP/log" 2>&1 ||
    bad "resume N = 4 as 2 x 2 -> --seq-ranks 3: $(grep -m1 streambp "$TMP/log")"
train_same "train N = 4 as 2 x 2 stopped at 3, resumed on 3 ranks sharing each sequence" "$RS" "$TMP/res-g22"
# ... and a T too short for S is refused before the run directory is begun
"${MPIRUN[@]}" -np 4 "$BIN" train --model "$Q" ${STR/--seq 300/--seq 200} --seq-ranks 4 \
    --out "$TMP/fail-seq4" >"$TMP/log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "T = 200 is too short to share among 4 ranks" "$TMP/log" && [ ! -e "$TMP/fail-seq4" ] &&
    ok "train --seq-ranks 4 with T = 200: exit 2, named, nothing written" ||
    bad "train --seq-ranks 4 with T = 200: exit $rc ($(grep -m1 streambp "$TMP/log"))"
left=$(find "$TMPDIR" -maxdepth 1 -name 'streambp-rank-*' 2>/dev/null | wc -l)
[ "$left" = 0 ] && ok "no rank's private directory left" || bad "$left private rank directories left"

# Under the sanitizers (SBP_SAN=1, make test SAN=1) sequence parallel runs a few cases: the relay
# (S = 2, 3), the tied embedding's carry, DPO's gathered log-probs, the pieces of micro-batches,
# train and the failures; its peaks and plans (T = 4096) are the plain build's to check.
SANQ=${SBP_SAN:-0}
seq_full() { [ "$SANQ" != 1 ]; } # the case runs in the plain build only
# sequence parallel (docs/distributed.md §8): `mpirun -np S grad --seq-ranks S`, each rank holding
# whole 128-token blocks of every sequence (T = 450: a multiple of neither S nor a block; T = 300:
# DPO, GRPO), is the same bytes as one process: stream, ckpt and full, tied and untied heads,
# Gemma-3 with its window across the ranks' rows, DPO, GRPO, LoRA, fp64, bf16, micro-batches of
# different T, the fast numerics
seq_same() { SEQ=1 same "$@"; } # NAME "S..." ARGS...: same, with --seq-ranks S
G3=$(model gemma3-tiny) S450=data/batches/seq-sft-450.safetensors
S1=data/batches/seq-sft-1x450.safetensors # one sequence: --seq-overlap's late head round
SD="--batch data/batches/seq-dpo-300.safetensors --objective dpo --beta 0.1"
seq_same seq-llama-stream "$(seq_full && echo 2 3 4 || echo 2 3)" --model "$L" --batch $S450 $P \
    --chunk 7 --block 4
seq_same seq-qwen3-tied-stream "3" --model "$Q" --batch $S450 $P --chunk 50 --logit-chunk 33 \
    --seq-overlap
seq_full && seq_same seq-qwen3-tied-full "4" --model "$Q" --batch $S450 $P --schedule full
seq_full && seq_same seq-llama-ckpt "3" --model "$L" --batch $S450 $P --schedule ckpt
seq_full && seq_same seq-llama-ckpt-chunked "2" --model "$L" --batch $S450 $P --schedule ckpt \
    --chunked-logits --logit-chunk 3
seq_same seq-gemma3-stream "$(seq_full && echo 2 3 4 || echo 3)" --model "$G3" --batch $S450 $P --chunk 20
seq_full && seq_same seq-gemma3-full "2" --model "$G3" --batch $S450 $P --schedule full --seq-overlap
seq_full && seq_same seq-qwen2-fp64 "3" --model "$Q2" --batch $S450 $P --precision fp64
seq_full && seq_same seq-llama-bf16 "2" --model "$L" --batch $S450 $P --precision bf16 --seq-overlap
seq_same seq-qwen2-dpo "3" --model "$Q2" $SD $P --seq-overlap
seq_full && seq_same seq-qwen2-dpo-ipo "2" --model "$Q2" $SD $P --loss-type ipo
seq_full && seq_same seq-llama-grpo "2" --model "$L" --batch data/batches/seq-grpo-300.safetensors \
    --objective grpo $P
seq_full && seq_same seq-qwen3-lora "3" --model "$Q" --lora "$A" --batch $S450 $P --seq-overlap \
    --logit-chunk 50
seq_same seq-llama-micro "2" --model "$L" --batch $S450 --batch data/batches/sft-t700.safetensors \
    --batch $S450 $P --chunk 9
seq_full && seq_same seq-llama-fast "3" --model "$L" --batch $S450 --block 64 --chunk 64 --seq-overlap
# --seq-overlap with one sequence: the head's round of a rank after the first runs inside its
# layers' backward, from a scratch of its own, and the top layer's K/V side is kept from the
# forward (untied; tied in the fast numerics; a frozen head; Gemma-3's window; full BP with
# logits in passes)
seq_same seq-llama-late "$(seq_full && echo 2 3 || echo 2)" --model "$L" --batch $S1 $P --chunk 7 \
    --block 4 --seq-overlap
seq_full && seq_same seq-qwen3-tied-late "2" --model "$Q" --batch $S1 --block 64 --chunk 64 \
    --logit-chunk 32 --seq-overlap
seq_full && seq_same seq-qwen3-lora-late "2" --model "$Q" --lora "$A" --batch $S1 $P --seq-overlap \
    --logit-chunk 50
seq_full && seq_same seq-gemma3-late "3" --model "$G3" --batch $S1 $P --chunk 20 --seq-overlap
seq_full && seq_same seq-qwen2-full-late "2" --model "$Q2" --batch $S1 $P --schedule full \
    --chunked-logits --logit-chunk 40 --seq-overlap
# data parallel between groups sharing each sequence (N = D x S): group g runs micro-batches
# k = g (mod D), the owners fold them in k order
seq_same seq-llama-groups "$(seq_full && echo 4:2 6:3 || echo 4:2)" --model "$L" --batch $S450 \
    --batch data/batches/sft-t700.safetensors --batch $S450 --batch data/batches/sft-t700.safetensors \
    $P --chunk 9
seq_full && seq_same seq-qwen2-dpo-groups "4:2" --model "$Q2" $SD \
    --batch data/batches/seq-dpo-300.safetensors $P
seq_full && seq_same seq-llama-groups-late "4:2" --model "$L" --batch $S1 --batch $S450 --batch $S1 \
    --batch $S1 $P --chunk 9 --seq-overlap
# the network model (plan --seq-ranks, the rank sending the most: its K/V, hand-overs, pieces,
# losses and share to rank 0's file) against the transport's counters, the start-up check's
# all-gather of 5376 bytes, one message to each peer, taken off; family:N:S:micro-batches:schedule
# (Gemma-3: its local layers' keys travel only as far as the window reaches)
for c in qwen3-tiny:4:2:2:stream qwen3-tiny:4:2:2:full gemma3-tiny:3:3:1:stream; do
    IFS=: read -r fam np sr nb sch <<<"$c"
    bb=$(for _ in $(seq "$nb"); do printf -- "--batch %s " "$S450"; done)
    "${MPIRUN[@]}" -np "$np" "$BIN" grad --model "$(model "$fam")" $bb --block 8 --chunk 40 \
        --threads 2 --schedule "$sch" --seq-ranks "$sr" --out "$TMP/seq-net.st" >"$TMP/log" 2>&1
    got=$(grep -o 'sent per rank[^:]*: .*' "$TMP/log" | cut -d: -f2 | tr ' ' '\n' | grep / |
        awk -F/ -v n="$np" '$1 > b { b = $1; m = $2 } END { print b - 5376 * (n - 1), m - (n - 1) }')
    want=$(OMP_NUM_THREADS=2 "$BIN" plan --config "data/models/$fam.json" --seq 450 \
        --batch-size 2 --grad-accum "$nb" --ranks "$np" --seq-ranks "$sr" --block 8 --chunk 40 \
        --schedules "$sch" --json |
        sed -n 's/.*"sent_\(bytes\|messages\)_per_step":[^0-9]*\([0-9]*\).*/\2/p' | tr '\n' ' ')
    [ "$got " = "$want" ] && ok "plan --ranks $np --seq-ranks $sr ($fam, $sch): the network model, $got bytes/messages, as sent" ||
        bad "plan --ranks $np --seq-ranks $sr ($fam, $sch): network model ${want:-?}, sent ${got:-?}"
done
# ... and over TCP on loopback (no shared memory between the ranks' transports), once
timeout 60 mpirun --oversubscribe --allow-run-as-root --mca btl self,tcp --mca btl_tcp_if_include lo \
    -np 2 "$BIN" grad --model "$L" --batch $S450 $P --chunk 7 --block 4 --threads 1 --seq-ranks 2 \
    --out "$TMP/seq-tcp.safetensors" >"$TMP/log" 2>&1
rc=$?
[ $rc = 0 ] && cmp -s "$TMP/seq-llama-stream-1p.safetensors" "$TMP/seq-tcp.safetensors" &&
    ok "seq-llama-stream --seq-ranks 2 over TCP on loopback: the same bytes as one process" ||
    bad "seq-llama-stream --seq-ranks 2 over TCP: exit $rc ($(grep -m1 streambp "$TMP/log"))"
# a rank's ledger peak falls with S on a model whose layer inputs dominate (32 layers of 64,
# T = 4096): S = 2 below 0.75 x one process's (the weights and a layer's working set, 28% of one
# process's peak, do not split, so 0.64 is the floor; 0.70 read 0.69997 and flipped with a few KiB
# of product workspace), S = 4 below S = 2; and plan --seq-ranks S plans the
# rank holding the most to the byte (stream, S = 2, 3, 4; full, S = 2)
if seq_full; then
    python3 -c '
import json, sys
c = json.load(open("data/models/llama3-tiny.json")); c["num_hidden_layers"] = 32
json.dump(c, open(sys.argv[1], "w"))' "$TMP/tall.json" &&
        "$BIN" init --config "$TMP/tall.json" --seed 1 --out "$TMP/model-tall" >/dev/null &&
        python3 -c '
import sys; sys.path.insert(0, "data"); import make_batches as mb
u = mb.lcg(7); mb.write(sys.argv[1], [mb.custom(u, 4096, "i" * 100 + "v" * 3996)], "I64")' \
            "$TMP/t4096.safetensors" || bad "the tall model or its batch"
    TALL="--model $TMP/model-tall --batch $TMP/t4096.safetensors --threads 1"
    SEQPEAK[1]=$("$BIN" grad $TALL --json --out "$TMP/tall-1.st" 2>/dev/null | sed -n 's/.*"peak_total_bytes":[^0-9]*\([0-9]*\).*/\1/p' | head -1)
    # (and with --seq-overlap, which keeps a layer's weight-product operands and cuts the rows by
    # work, 2560 and 1536 here: planned too, and one process's bytes)
    for sn in stream:2 stream:4 full:2 stream:3:--seq-overlap stream:2:--seq-overlap; do
        IFS=: read -r sch n ov <<<"$sn"
        got=$("${MPIRUN[@]}" -np $n "$BIN" grad $TALL --schedule $sch --seq-ranks $n $ov \
            ${ov:+--out "$TMP/tall-ov.st"} 2>&1 |
            sed -n 's/.*ledger peak of the rank holding the most: \([0-9]*\) bytes.*/\1/p')
        [ $sch = stream ] && [ -z "$ov" ] && SEQPEAK[$n]=$got
        want=$("$BIN" plan --config "$TMP/tall.json" --seq 4096 --schedules $sch --seq-ranks $n $ov --json |
            sed -n 's/.*"total":[^0-9]*\([0-9]*\).*/\1/p' | head -1)
        [ -n "$got" ] && [ "$got" = "$want" ] && ok "plan --seq-ranks $n $ov${ov:+ }($sch): $want bytes, as measured" ||
            bad "plan --seq-ranks $n $ov${ov:+ }($sch): planned ${want:-?}, measured ${got:-?}"
    done
    cmp -s "$TMP/tall-1.st" "$TMP/tall-ov.st" &&
        ok "--seq-ranks 2 --seq-overlap, rows cut by work (tall model): one process's bytes" ||
        bad "--seq-ranks 2 --seq-overlap, rows cut by work (tall model): not one process's bytes"
    if [ -n "${SEQPEAK[1]}" ] && [ -n "${SEQPEAK[2]}" ] && [ -n "${SEQPEAK[4]}" ] &&
        [ $((SEQPEAK[2] * 4)) -lt $((SEQPEAK[1] * 3)) ] && [ "${SEQPEAK[4]}" -lt "${SEQPEAK[2]}" ]; then
        ok "--seq-ranks: a rank's peak falls with S (${SEQPEAK[1]}, ${SEQPEAK[2]}, ${SEQPEAK[4]} bytes)"
    else
        bad "--seq-ranks: peaks ${SEQPEAK[1]:-?}, ${SEQPEAK[2]:-?}, ${SEQPEAK[4]:-?} bytes (S = 1, 2, 4)"
    fi
fi
# refused on every rank with exit 2, nothing written: S not dividing N, groups not dividing the
# micro-batches, and a T too short for S whole blocks
"${MPIRUN[@]}" -np 2 "$BIN" grad --model "$L" --batch $S450 $P --seq-ranks 3 --threads 1 \
    --out "$TMP/fail-s3" >"$TMP/log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q -- "--seq-ranks 3 must divide the process count" "$TMP/log" &&
    [ ! -e "$TMP/fail-s3" ] && ok "--seq-ranks 3 under -np 2: exit 2, named, nothing written" ||
    bad "--seq-ranks 3 under -np 2: exit $rc ($(grep -m1 streambp "$TMP/log"))"
"${MPIRUN[@]}" -np 4 "$BIN" grad --model "$L" --batch $S450 $P --seq-ranks 2 --threads 1 \
    --out "$TMP/fail-g2" >"$TMP/log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "1 micro-batches cannot be shared by 2 groups of 2 ranks" "$TMP/log" &&
    [ ! -e "$TMP/fail-g2" ] && ok "one micro-batch for 2 groups of 2: exit 2, named, nothing written" ||
    bad "one micro-batch for 2 groups of 2: exit $rc ($(grep -m1 streambp "$TMP/log"))"
# ... and without a launcher
"$BIN" grad --model "$L" --batch $S450 $P --seq-ranks 2 --out "$TMP/fail-1p" >"$TMP/log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "but this is one process: run it under mpirun" "$TMP/log" && [ ! -e "$TMP/fail-1p" ] &&
    ok "--seq-ranks 2 without a launcher: exit 2, named, nothing written" ||
    bad "--seq-ranks 2 without a launcher: exit $rc ($(grep -m1 streambp "$TMP/log"))"
# a token outside the vocabulary in rank 1's rows: every rank ends with one process's message
python3 -c '
import sys; sys.path.insert(0, "data"); import make_batches as mb
u = mb.lcg(7); row = mb.custom(u, 450, "i" * 10 + "v" * 440); row[0][300] = 100000
mb.write(sys.argv[1], [row], "I64")' "$TMP/badtok.safetensors"
want=$("$BIN" grad --model "$L" --batch "$TMP/badtok.safetensors" $P 2>&1 | grep -o "input_ids.*")
"${MPIRUN[@]}" -np 2 "$BIN" grad --model "$L" --batch "$TMP/badtok.safetensors" $P --seq-ranks 2 \
    --threads 1 --out "$TMP/fail-tok" >"$TMP/log" 2>&1
rc=$?
# (every rank finds the error and ends the job with MPI_Abort, src/cli/dist_cli.c; the first
# abort may end the other rank before it prints, so one message or two: it raced on Zen 3)
[ $rc = 2 ] && [ -n "$want" ] && [ "$(grep -F -- "$want" "$TMP/log" | grep -c "rank [01]: ")" -ge 1 ] &&
    [ ! -e "$TMP/fail-tok" ] && ok "a token outside the vocabulary in rank 1's rows: exit 2 on every rank, one process's message, nothing written" ||
    bad "a token outside the vocabulary in rank 1's rows: exit $rc ($(grep -m1 streambp "$TMP/log"))"
# HF's rows that see no key attend to every key, the later ranks' too: refused, not run wrong
# (seq-sft-450's second row starts with 200 padding tokens)
"${MPIRUN[@]}" -np 2 "$BIN" grad --model "$L" --batch $S450 --unattended hf-eager $P --seq-ranks 2 \
    --threads 1 --out "$TMP/fail-un" >"$TMP/log" 2>&1
rc=$?
[ $rc = 2 ] && [ "$(grep -c "rank [01]: --unattended hf-eager with --seq-ranks: micro-batch 0 has queries that see no key" "$TMP/log")" -ge 1 ] &&
    [ ! -e "$TMP/fail-un" ] && ok "--unattended hf-eager with rows that see no key: exit 2 on every rank, named, nothing written" ||
    bad "--unattended hf-eager with rows that see no key: exit $rc ($(grep -m1 streambp "$TMP/log"))"
"${MPIRUN[@]}" -np 4 "$BIN" grad --model "$L" --batch data/batches/seq-dpo-300.safetensors \
    --objective dpo $P --seq-ranks 4 --threads 1 >"$TMP/log" 2>&1
rc=$?
[ $rc = 2 ] && grep -q "T = 300 is too short to share among 4 ranks" "$TMP/log" &&
    ok "--seq-ranks 4 with T = 300: exit 2, named" ||
    bad "--seq-ranks 4 with T = 300: exit $rc ($(grep -m1 streambp "$TMP/log"))"

# failures: a killed rank, a stopped rank, a non-finite gradient on one rank, planted by the
# faults build (tests/faults.c, SBP_FAULT=what:rank:run:bucket); each ends within its deadline,
# with no process left and the first error reported: for every family (tied and untied heads),
# under grad and train, a dead and a silent peer at the first, a middle and the last bucket of
# its micro-batch
FAULTS=$(realpath "${FAULTS:-$(dirname "$BIN")/tests/streambp-faults}")
leftover() { # processes of this test (their command line names its private directory) still alive
    local p pids
    pids=$(pgrep -f "$TMP/fail-") || return 0
    for p in $pids; do kill -9 "$p" 2>/dev/null; done
    echo " (processes left: $pids)"
}
# fault FAMILY grad|train kill|stop BUCKET: rank 1 dies or goes silent in its second micro-batch
fault() {
    local fam=$1 cmd=$2 what=$3 at=$4 m args t0 rc secs left name verb=killed
    m=$(model "$fam")
    [ "$what" = stop ] && verb=stopped
    name="$fam $cmd: rank 1 $verb at the $at bucket"
    if [ "$cmd" = grad ]; then
        args="--model $m --batch data/batches/sft-tiny.safetensors --batch data/batches/sft-tiny.safetensors"
        args="$args --batch data/batches/sft-tiny.safetensors --batch data/batches/sft-tiny.safetensors"
        args="$args --out $TMP/fail-$fam-$what-$at.st"
    else
        args="--model $m --jsonl data/train/counting.jsonl --seq 32 --batch-size 1 --grad-accum 4"
        args="$args --steps 2 --out $TMP/fail-$fam-$what-$at"
    fi
    t0=$(date +%s)
    SBP_FAULT=$what:1:2:$at "${MPIRUN[@]}" -np 2 "$FAULTS" $cmd $args --threads 1 --comm-timeout 3 \
        >"$TMP/log" 2>&1
    rc=$? secs=$(($(date +%s) - t0)) left=$(leftover)
    if grep -q "internal:" "$TMP/log"; then
        bad "$name: a later error reported: $(grep -m1 internal: "$TMP/log")"
    elif [ "$what" = kill ]; then
        [ $rc != 0 ] && [ $secs -le 10 ] && [ -z "$left" ] && ok "$name: exit $rc in $secs s" ||
            bad "$name: exit $rc in $secs s$left ($(grep -m1 'streambp' "$TMP/log"))"
    else
        [ $rc = 3 ] && [ $secs -le 8 ] && [ -z "$left" ] && grep -q "nothing from rank 1" "$TMP/log" &&
            ok "$name: exit 3 in $secs s, rank 1 named" ||
            bad "$name: exit $rc in $secs s$left ($(grep -m1 'streambp.*rank' "$TMP/log"))"
    fi
}
if [ ! -x "$FAULTS" ]; then
    bad "no faults build at $FAULTS (make $FAULTS)"
else
    for fam in qwen3-tiny llama3-tiny qwen2-tiny gemma3-tiny; do
        fault $fam grad kill first
        fault $fam train kill middle
        fault $fam grad kill last
        fault $fam train stop first
        fault $fam grad stop middle
        fault $fam train stop last
    done
    # sequence parallel: the last rank (which completes every bucket) killed or stopped in the
    # middle of its second micro-batch; rank 0 waits on it in a relay and names it
    for what in kill stop; do
        t0=$(date +%s)
        SBP_FAULT=$what:1:2:middle "${MPIRUN[@]}" -np 2 "$FAULTS" grad --model "$Q" --batch $S450 \
            --batch $S450 $P --seq-ranks 2 --threads 1 --comm-timeout 3 \
            --out "$TMP/fail-seq-$what.st" >"$TMP/log" 2>&1
        rc=$? secs=$(($(date +%s) - t0)) left=$(leftover)
        # killed: the launcher ends the job with the dead rank's status; stopped: rank 0's deadline
        if [ "$what" = kill ]; then
            [ $rc != 0 ] && [ $secs -le 10 ] && [ -z "$left" ] && [ ! -e "$TMP/fail-seq-$what.st" ] &&
                ok "--seq-ranks 2: rank 1 killed mid-step: exit $rc in $secs s, nothing written" ||
                bad "--seq-ranks 2: rank 1 killed: exit $rc in $secs s$left ($(grep -m1 'streambp' "$TMP/log"))"
        else
            [ $rc = 3 ] && [ $secs -le 10 ] && [ -z "$left" ] && grep -q "nothing from rank 1" "$TMP/log" &&
                [ ! -e "$TMP/fail-seq-$what.st" ] &&
                ok "--seq-ranks 2: rank 1 stopped mid-step: exit 3 in $secs s, rank 1 named, nothing written" ||
                bad "--seq-ranks 2: rank 1 stopped: exit $rc in $secs s$left ($(grep -m1 'streambp.*rank' "$TMP/log"))"
        fi
    done
    # ... and as 2 groups of 2: group 1's last rank stopped in its second micro-batch; its group
    # waits on it in a relay, group 0's ranks for its pieces, and every rank names it
    t0=$(date +%s)
    SBP_FAULT=stop:3:2:middle "${MPIRUN[@]}" -np 4 "$FAULTS" grad --model "$Q" --batch $S450 \
        --batch $S450 --batch $S450 --batch $S450 $P --seq-ranks 2 --threads 1 --comm-timeout 3 \
        --out "$TMP/fail-groups.st" >"$TMP/log" 2>&1
    rc=$? secs=$(($(date +%s) - t0)) left=$(leftover)
    [ $rc = 3 ] && [ $secs -le 12 ] && [ -z "$left" ] && grep -q "nothing from rank 3" "$TMP/log" &&
        [ ! -e "$TMP/fail-groups.st" ] &&
        ok "N = 4 as 2 x 2: rank 3 stopped mid-step: exit 3 in $secs s, rank 3 named, nothing written" ||
        bad "N = 4 as 2 x 2: rank 3 stopped: exit $rc in $secs s$left ($(grep -m1 'streambp.*rank' "$TMP/log"))"
    FT="--model $Q --jsonl data/train/counting.jsonl --seq 32 --batch-size 1 --grad-accum 4 --steps 4 --threads 1"
    SBP_FAULT=nan:0:2:first "${MPIRUN[@]}" -np 2 "$FAULTS" train $FT --out "$TMP/fail-nan" >"$TMP/log" 2>&1
    rc=$?
    [ $rc = 1 ] && [ "$(grep -c 'gradient of "model.norm.weight" is not finite' "$TMP/log")" = 2 ] &&
        ! grep -q MPI_ABORT "$TMP/log" && ok "a NaN in micro-batch 2 (rank 0): every rank exits 1, naming it" ||
        bad "a NaN in micro-batch 2: exit $rc ($(grep -m1 'streambp train: rank' "$TMP/log"))"
fi
cp data/train/counting.jsonl "$TMP/a.jsonl" && cp "$TMP/a.jsonl" "$TMP/b.jsonl" && echo '{"text": "x"}' >>"$TMP/b.jsonl"
MT="--model $Q --seq 32 --batch-size 1 --steps 2 --threads 1 --out $TMP/fail-mm"
mismatch() { # what-is-named rank0-args : rank1-args
    local name=$1 a0=$2 a1=$3
    "${MPIRUN[@]}" -np 1 "$BIN" train $MT $a0 : -np 1 "$BIN" train $MT $a1 >"$TMP/log" 2>&1
    rc=$?
    [ $rc = 2 ] && grep -q "ranks 0 and 1 differ in $name" "$TMP/log" && [ ! -e "$TMP/fail-mm" ] &&
        ok "different $name on two ranks: exit 2, named" ||
        bad "different $name on two ranks: exit $rc ($(grep -m1 'streambp' "$TMP/log"))"
}
mismatch "--jsonl" "--jsonl $TMP/a.jsonl" "--jsonl $TMP/b.jsonl"
mismatch "--lr" "--jsonl $TMP/a.jsonl --lr 1e-3" "--jsonl $TMP/a.jsonl --lr 2e-3"
mismatch "--grad-accum" "--jsonl $TMP/a.jsonl --grad-accum 2" "--jsonl $TMP/a.jsonl --grad-accum 4"
mismatch "--precision" "--jsonl $TMP/a.jsonl --precision fp32" "--jsonl $TMP/a.jsonl --precision fp64"
mismatch "--seq-ranks" "--jsonl $TMP/a.jsonl --seq-ranks 2" "--jsonl $TMP/a.jsonl --seq-ranks 1"

# N must divide the micro-batches: every rank exits 2, naming both numbers
"${MPIRUN[@]}" -np 5 "$BIN" grad --model "$L" $SFT --threads 1 >"$TMP/log" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "12 micro-batches cannot be shared by 5 processes" "$TMP/log"; then
    ok "N=5 with 12 micro-batches: exit 2, named"
else
    bad "N=5 with 12 micro-batches: exit $rc ($(tail -1 "$TMP/log"))"
fi

# ... and train refuses it before it writes anything: no run directory (loss.csv, timing.csv)
"${MPIRUN[@]}" -np 2 "$BIN" train --model "$L" --jsonl data/train/counting.jsonl --seq 16 \
    --steps 2 --grad-accum 3 --threads 1 --out "$TMP/fail-n" >"$TMP/log" 2>&1
rc=$?
if [ $rc = 2 ] && grep -q "3 micro-batches a step (--grad-accum) cannot be shared by 2 processes" \
    "$TMP/log" && [ ! -e "$TMP/fail-n" ]; then
    ok "train N=2 with --grad-accum 3: exit 2, named, nothing written"
else
    bad "train N=2 with --grad-accum 3: exit $rc, $(ls "$TMP/fail-n" 2>/dev/null | tr '\n' ' ')($(grep -m1 'streambp' "$TMP/log"))"
fi

# a build without MPI under a launcher with more than one process exits 2
if [ -n "$NOMPI" ]; then
    "${MPIRUN[@]}" -np 2 "$(realpath "$NOMPI")" grad --model "$L" $SFT --threads 1 >"$TMP/log" 2>&1
    rc=$?
    if [ $rc = 2 ] && grep -q "this build has no MPI" "$TMP/log"; then
        ok "a build without MPI under mpirun -np 2: exit 2"
    else
        bad "a build without MPI under mpirun -np 2: exit $rc ($(tail -1 "$TMP/log"))"
    fi
fi

echo "mpi_ranks.sh: $runs checks, $fails failed"
[ $fails = 0 ]
