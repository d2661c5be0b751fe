#!/bin/sh
# plant.sh — builds the binaries with planted bugs that tests/test_plant.c feeds to the verifier:
# $BUILD/plant/<name>/streambp is build/streambp with one source file recompiled with the flags
# below (each #ifdef SBP_PLANT_* in that file is compiled out of every normal build). Called by
# `make plants` (part of `make test`), which passes the compiler settings and object lists:
# CC CFLAGS LDFLAGS LDLIBS LD BUILD OBJS (the objects of the binary but the engines) F32_OBJ
# ENGINE_KEEP (objcopy's --keep-global-symbol words: the engine's entry points).
# A plant is rebuilt only when the binary or its source is newer than it.
set -eu
plants='
unshifted-normaliser    src/io/batch.c        -DSBP_PLANT_UNSHIFTED_NORMALISER
dpo-pad-label-zero      src/io/batch.c        -DSBP_PLANT_DPO_PAD_LABEL_ZERO
biased-std              src/io/batch.c        -DSBP_PLANT_BIASED_STD
unshifted-token-logps   src/io/batch.c        -DSBP_PLANT_UNSHIFTED_TOKEN_LOGPS
head-dim-default        src/io/config.c       -DSBP_PLANT_HEAD_DIM_DEFAULT
micro-sft-normaliser    src/core/objective.c  -DSBP_PLANT_MICRO_SFT_NORMALISER
micro-bnpo              src/core/objective.c  -DSBP_PLANT_MICRO_BNPO
micro-dr-grpo-lmax      src/core/objective.c  -DSBP_PLANT_MICRO_DR_GRPO_LMAX
clip-one-epsilon        src/core/objective.c  -DSBP_PLANT_CLIP_ONE_EPSILON
ref-ignores-temperature src/api/reference.c   -DSBP_PLANT_REF_IGNORES_TEMPERATURE
f32-rope-angle          src/kernels/rope.c    -DSBP_PLANT_F32_ROPE_ANGLE
loose-fp32-budget       verify/matrix.c       -DSBP_PLANT_LOOSE_FP32_BUDGET
loose-fp64-budget       verify/matrix.c       -DSBP_PLANT_LOOSE_FP64_BUDGET
bitwise-as-close        verify/matrix.c       -DSBP_PLANT_BITWISE_AS_CLOSE
golden-line-prefix      verify/digest.c       -DSBP_PLANT_GOLDEN_LINE_PREFIX
fast-tile-tail          src/kernels/fast/attention.c -DSBP_PLANT_FAST_TILE_TAIL
fast-window-mask        src/kernels/fast/attention.c -DSBP_PLANT_FAST_WINDOW_MASK
'
echo "$plants" | while read -r name src flags; do
    [ -n "$name" ] || continue
    dir="$BUILD/plant/$name"
    out="$dir/streambp"
    if [ -f "$out" ] && [ "$out" -nt "$BUILD/streambp" ] && [ "$out" -nt "$src" ] &&
        [ "$out" -nt tests/plant.sh ]; then
        continue
    fi
    mkdir -p "$dir"
    obj="$BUILD/common/${src%.c}.o"
    case "$src" in
    src/kernels/* | src/engine/*) # the float32 engine, relinked with the planted object
        # shellcheck disable=SC2086 # the flags are words
        $CC $CFLAGS $flags -c "$src" -o "$dir/planted.o"
        f32=$(echo "$F32_OBJ" | tr ' ' '\n' | sed "s|^$BUILD/f32/${src%.c}.o\$|$dir/planted.o|")
        # shellcheck disable=SC2086
        $LD -r -o "$dir/engine_f32.tmp.o" $f32
        # shellcheck disable=SC2086 # the Makefile's --keep-global-symbol words
        objcopy $ENGINE_KEEP "$dir/engine_f32.tmp.o" "$dir/engine_f32.o"
        rm -f "$dir/engine_f32.tmp.o"
        objs="$OBJS $dir/engine_f32.o $BUILD/engine_f64.o"
        ;;
    *)
        # shellcheck disable=SC2086
        $CC $CFLAGS $flags -c "$src" -o "$dir/planted.o"
        objs="$(echo "$OBJS" | tr ' ' '\n' | sed "s|^$obj\$|$dir/planted.o|" | tr '\n' ' ')"
        objs="$objs $BUILD/engine_f32.o $BUILD/engine_f64.o"
        ;;
    esac
    # shellcheck disable=SC2086
    $CC $LDFLAGS -o "$out" $objs $LDLIBS
    echo "planted $name: $out"
done
