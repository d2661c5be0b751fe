#!/bin/sh
# blas.sh — bench/blas_rates.c built against every BLAS found and run in interleaved rounds at
# 1 and 2 threads (`make bench-blas`). Speeds drift on shared machines, so each round runs every
# library once and the summary gives each library's median and its median ratio to OpenBLAS
# within a round.
#
#   [BLAS_ISA=avx2] bench/blas.sh OUTDIR ROUNDS OPENBLAS_LIBDIR [MKL_PREFIX]
#
# BLIS: Debian's libblis-openmp-dev. MKL: a prefix holding include/mkl.h and lib/libmkl_*.so.3
# (PyPI's mkl-devel in a venv; GNU OpenMP threading, as the rest of streambp uses libgomp).
set -eu
out=$1 rounds=$2 openblas=$3 mkl=${4:-}
cc=${CC:-gcc}
src=$(dirname "$0")/blas_rates.c
flags="-O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -fopenmp"
mkdir -p "$out"

libs=openblas
$cc $flags -isystem /usr/include/x86_64-linux-gnu/openblas-openmp "$src" -o "$out/blas-openblas" \
    -L"$openblas" -lopenblas -Wl,-rpath,"$openblas" -lm
blis=/usr/lib/x86_64-linux-gnu/blis-openmp
if [ -e "$blis/libblis.so" ]; then
    $cc $flags -DBLAS_BLIS -isystem /usr/include/x86_64-linux-gnu/blis-openmp "$src" \
        -o "$out/blas-blis" -L"$blis" -lblis -Wl,-rpath,"$blis" -lm
    libs="$libs blis"
else
    echo "blas.sh: no BLIS ($blis/libblis.so); apt-get install libblis-openmp-dev" >&2
fi
so=
for v in 2 3; do [ -e "$mkl/lib/libmkl_core.so.$v" ] && so=$v; done
if [ -n "$mkl" ] && [ -e "$mkl/include/mkl.h" ] && [ -n "$so" ]; then
    $cc $flags -DBLAS_MKL -isystem "$mkl/include" "$src" -o "$out/blas-mkl" \
        "$mkl/lib/libmkl_intel_lp64.so.$so" "$mkl/lib/libmkl_gnu_thread.so.$so" \
        "$mkl/lib/libmkl_core.so.$so" -Wl,-rpath,"$mkl/lib" -lm -ldl -lpthread
    libs="$libs mkl"
else
    echo "blas.sh: no MKL (give a prefix with include/mkl.h: pip install mkl-devel)" >&2
fi

# BLAS_ISA=avx2 (make bench-blas with a build for an ARCH without AVX-512, e.g. x86-64-v3): every
# library restricted to its AVX2 kernels, as on a CPU without AVX-512 (AMD Zen 2/3).
if [ "${BLAS_ISA:-}" = avx2 ]; then
    export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell} MKL_ENABLE_INSTRUCTIONS=AVX2
    export BLIS_ARCH_TYPE=haswell
    echo "BLAS_ISA=avx2: OpenBLAS $OPENBLAS_CORETYPE, MKL_ENABLE_INSTRUCTIONS=AVX2, BLIS_ARCH_TYPE=haswell"
fi
# OpenBLAS 0.3.21 misreads newer CPUs as Prescott (SSE3); streambp then runs with the AVX-512
# or AVX2 kernels (src/cli/main.c), and so does this comparison.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && [ "$("$out/blas-openblas" --core)" = Prescott ]; then
    if grep -q avx512bw /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -q avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi
echo "OpenBLAS kernels: $(OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} "$out/blas-openblas" --core)"
export OMP_WAIT_POLICY=PASSIVE

raw="$out/blas-rounds.txt"
: >"$raw"
r=1
while [ "$r" -le "$rounds" ]; do
    for t in 1 2; do
        for l in $libs; do
            printf '%s ' "$r" >>"$raw"
            "$out/blas-$l" "$l" "$t" >>"$raw"
        done
    done
    r=$((r + 1))
done

python3 - "$raw" "$rounds" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
# round lib threads layers head whole square repeat rows threads-inv
by = {}
for r in rows:
    by.setdefault((r[1], int(r[2])), []).append(r)
print("GFLOP/s, median of %s interleaved rounds; ratio: the median over rounds of lib / OpenBLAS"
      % sys.argv[2])
print("%-9s %3s %9s %9s %9s %9s %8s %7s %7s %7s" % ("BLAS", "thr", "layers", "lm_head",
      "whole", "2048^3", "ratio", "repeat", "rows", "1-vs-N"))
for (lib, t), rs in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0] != "openblas", kv[0][0])):
    med = [statistics.median(float(r[i]) for r in rs) for i in (3, 4, 5, 6)]
    base = {r[0]: float(r[3]) for r in by[("openblas", t)]}
    ratio = statistics.median(float(r[3]) / base[r[0]] for r in rs)
    rep = "same" if all(r[7] == "same" for r in rs) else "DIFFER"
    rows = "same" if all(r[8] == "same" for r in rs) else "DIFFER"
    inv = "-" if t == 1 else "same" if all(r[9] == "same" for r in rs) else "DIFFER"
    print("%-9s %3d %9.1f %9.1f %9.1f %9.1f %8.3f %7s %7s %7s" % (lib, t, *med, ratio, rep, rows,
                                                                inv))
print("layers: the seven projections of every layer, forward, dW and dx, per 256-token block as"
      " the fast mode issues them; lm_head: the same for the vocabulary projection; whole: one"
      " T-row call per projection shape; repeat / 1-vs-N: the same bits on a second identical"
      " call / at 1 thread; rows: one T-row call gives each row the per-block calls' bits")
EOF
