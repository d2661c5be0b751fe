#!/usr/bin/env bash
# gpu-check.sh — the checks of `make gpu-check` (short) and `make gpu-check-long` on a machine with
# a GPU, run against an already built binary. Every stage's exit status counts: no stage's
# failure can be hidden by a pipe (pipefail) or by a later stage (errexit).
#
#   cuda/gpu-check.sh short|long
#
# Environment: STREAMBP (the binary, default build/streambp), GOLDEN_TEST (the golden-digest
# test binary, default build/tests/test_golden), OUT (a directory for outputs, default build),
# SBP_GPU_TFLOPS (the rate the time estimate assumes for the portable kernels, default 1).
#
# The short run is sized for a ten-minute GPU session: it prints its time estimate first and
# must finish in under 8 minutes on an H200-class GPU; the long one adds T = 32768 and the largest
# T that fits in 85% of the device's free memory.
set -euo pipefail

mode=${1:-short}
case $mode in short | long) ;; *) echo "usage: $0 short|long" >&2; exit 2 ;; esac
BIN=${STREAMBP:-build/streambp}
GOLDEN=${GOLDEN_TEST:-build/tests/test_golden}
OUT=${OUT:-build}
TFLOPS=${SBP_GPU_TFLOPS:-1}
CONFIG=data/configs/qwen3-0.6b.json
FAMILIES="qwen3-tiny qwen2-tiny llama3-tiny qwen2-hd24 qwen3-hd72"
mkdir -p "$OUT"

command -v nvidia-smi >/dev/null || { echo "gpu-check: no GPU here (nvidia-smi not found)"; exit 2; }
nvidia-smi -L
free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -n 1)
case $free_mib in '' | *[!0-9]*) echo "gpu-check: nvidia-smi gave no free memory ('$free_mib')"; exit 2 ;; esac

# ---- the time estimate, before anything runs ------------------------------------------------
# A bench step at T costs about 8·P·T (forward, backward, one recompute) plus 12·L·T²·q_dim for
# attention (forward, backward and the recompute of its scores); the tiny-model stages are bound
# by launches and CUDA start-up, about a second per process (90 golden runs, 5 verify runs, the
# 20 runs of the long-sequence stage and the sanitizer's three runs at ~40× a plain run).
params=$("$BIN" plan --config "$CONFIG" --seq 512 --json | sed -n 's/^[[:space:]]*"parameters":[[:space:]]*\([0-9]*\).*/\1/p')
layers=$(sed -n 's/.*"num_hidden_layers":[[:space:]]*\([0-9]*\).*/\1/p' "$CONFIG")
qdim=$(($(sed -n 's/.*"num_attention_heads":[[:space:]]*\([0-9]*\).*/\1/p' "$CONFIG") *
    $(sed -n 's/.*"head_dim":[[:space:]]*\([0-9]*\).*/\1/p' "$CONFIG")))
step_s() { # seconds of one step at T, at TFLOPS
    awk -v p="$params" -v l="$layers" -v q="$qdim" -v t="$1" -v r="$TFLOPS" \
        'BEGIN { printf "%.0f", (8 * p * t + 12 * l * t * t * q) / (r * 1e12) }'
}
small_s=$((90 + 5 + 20 + 3 * 40))
if [ "$mode" = short ]; then
    bench_T=4096
    bench_s=$((2 * $(step_s 4096)))           # full and stream, one step each
else
    bench_T="8192 32768"
    bench_s=$((3 * ($(step_s 8192) + $(step_s 32768))))
fi
echo "gpu-check ($mode): estimate $((small_s + bench_s)) s = ${small_s} s of tiny-model stages +" \
    "${bench_s} s of bench steps at ${TFLOPS} TFLOP/s (SBP_GPU_TFLOPS); free device memory ${free_mib} MiB"

# ---- 1. golden digests on the GPU -------------------------------------------------------------
echo "== golden digests, --device cuda"
SBP_GOLDEN_DEVICE=cuda STREAMBP=$BIN "$GOLDEN"

# ---- 2. the verifier's devices group, every launch synchronized and checked -------------------
for f in $FAMILIES; do
    echo "== verify --devices cpu,cuda on $f (SBP_CUDA_SYNC=1)"
    rm -rf "$OUT/gpu-$f"
    "$BIN" init --config "data/models/$f.json" --seed 1 --out "$OUT/gpu-$f" >/dev/null
    SBP_CUDA_SYNC=1 "$BIN" verify --model "$OUT/gpu-$f" --batch data/batches/sft-tiny.safetensors \
        --block 4 --devices cpu,cuda --numerics portable --threads 1 --failures-only >"$OUT/gpu-verify-$f.txt"
    tail -n 3 "$OUT/gpu-verify-$f.txt"
done

# ---- 3. long sequences, bitwise against the CPU ---------------------------------------------------
# The goldens are T <= 40 and V <= 512: one key tile, one token block, one vocabulary block. Here
# T = 700 (11 key tiles of the attention output's fold, 2 token blocks) on V = 1300 (3 vocabulary
# blocks of the head's dx, copy_cols), tied and untied, fp32 and fp64: every schedule on the GPU,
# a ragged chunk and logits chunk too, must give the portable CPU full run's bits.
for m in qwen3-vocab3 qwen2-vocab3; do
    rm -rf "$OUT/gpu-$m"
    "$BIN" init --config "data/models/$m.json" --seed 3 --out "$OUT/gpu-$m" >/dev/null
    for p in fp32 fp64; do
        long=(--model "$OUT/gpu-$m" --batch data/batches/sft-t700.safetensors --numerics portable
            --precision "$p")
        "$BIN" grad "${long[@]}" --device cpu --schedule full --out "$OUT/gpu-long-cpu.safetensors" \
            >"$OUT/gpu-long.txt"
        for s in "full" "ckpt" "stream --chunk 512" "stream --chunk 333 --logit-chunk 77"; do
            # shellcheck disable=SC2086 # $s is the schedule and its options
            SBP_CUDA_SYNC=1 "$BIN" grad "${long[@]}" --device cuda --schedule $s \
                --out "$OUT/gpu-long-cuda.safetensors" >"$OUT/gpu-long.txt"
            "$BIN" verify diff --bitwise "$OUT/gpu-long-cuda.safetensors" \
                "$OUT/gpu-long-cpu.safetensors" >"$OUT/gpu-long-diff.txt" ||
                { echo "== $m $p --schedule $s: the GPU differs from the CPU"
                  tail -n 20 "$OUT/gpu-long-diff.txt"; exit 1; }
        done
    done
    echo "== T = 700, V = 1300, $m: full, ckpt, stream (chunks 512 and 333/77) on the GPU, fp32" \
        "and fp64, bit for bit the portable CPU run"
done

# ---- 4. compute-sanitizer over one small run ---------------------------------------------------
SAN=$(command -v compute-sanitizer || true)
[ -n "$SAN" ] || for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
    [ -x "$d/compute-sanitizer" ] && SAN=$d/compute-sanitizer && break
done
skipped=0
if [ -z "$SAN" ]; then
    echo "== compute-sanitizer: SKIPPED (not installed)"
    skipped=1
else
    for tool in memcheck racecheck synccheck; do
        echo "== compute-sanitizer --tool $tool: grad --device cuda on qwen3-hd72"
        "$SAN" --tool "$tool" --error-exitcode 3 "$BIN" grad --model "$OUT/gpu-qwen3-hd72" \
            --batch data/batches/sft-tiny.safetensors --device cuda --numerics portable \
            --schedule stream --chunk 7 --block 4 --threads 1 \
            --out "$OUT/gpu-san-$tool.safetensors" >"$OUT/gpu-san-$tool.txt" 2>&1 ||
            { tail -n 40 "$OUT/gpu-san-$tool.txt"; exit 1; }
        tail -n 1 "$OUT/gpu-san-$tool.txt"
    done
fi

# ---- 5. the benchmark ---------------------------------------------------------------------------
echo "== bench on $CONFIG, --device cuda, T = $bench_T"
seqs=()
for t in $bench_T; do seqs+=(--seq "$t"); done
if [ "$mode" = short ]; then
    "$BIN" bench --config "$CONFIG" --device cuda "${seqs[@]}" --schedules full,stream --reps 1 \
        --warmup 0 --no-train | tee "$OUT/gpu-bench.txt"
else
    "$BIN" bench --config "$CONFIG" --device cuda "${seqs[@]}" --reps 1 --no-train |
        tee "$OUT/gpu-bench.txt"
    budget=$((free_mib * 85 / 100))
    echo "== the largest T in 85% of the free device memory: ${budget} MiB"
    "$BIN" bench --config "$CONFIG" --device cuda --largest "${budget}M" | tee -a "$OUT/gpu-bench.txt"
fi
echo "gpu-check ($mode): passed$([ $skipped = 0 ] || echo ", with the compute-sanitizer stage skipped")"
