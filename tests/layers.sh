#!/bin/sh
# layers.sh [ROOT] — the #include graph between the folders of the tree (ROOT, default the
# repository) against the layer order below: a file may include its own layer and the layers
# BELOW it, never one above. Since the order is total, the folders' include graph then has no
# cycle either. Run by `make test`; exits 1 naming each upward include (or an include that names
# no file of the tree, or a folder not in the list), 0 otherwise.
#
# The layers, lowest first (a folder's subfolders belong to it: src/engine/ops to src/engine):
#   src         the public header src/streambp.h: the types every layer speaks
#   src/core    errors, the ledger, the objective's host arithmetic, portable math, rng
#   src/kernels the numerical kernels (forward/backward pairs), on plain arrays
#   src/io      files: safetensors, configs, batches, adapters, JSON, the no-follow file layer
#   ref         the naive float64 oracle (reads files through src/io)
#   src/dist    the gradient buckets the engine hands out (distributed steps)
#   src/engine  the schedule driver, the layer steps and the op tables over the kernels
#   cuda/emu    the SIMT emulator the CUDA sources compile against on the host
#   cuda        the CUDA op tables (built on the engine's op-table interface)
#   src/api     the public entry points: sbp_grad, sbp_plan, sbp_logprobs, option resolution
#   src/train   the optimizer, data, checkpoints, the training loop
#   src/bench   the benchmark's measurements (`streambp bench`): steps, schedules, memory
#   verify      the verifier library (comparison matrix, audit, digests, fd, suite)
#   src/cli     the `streambp` command line
#   tests       tests/, cuda/emu/tests, bench/, python/: may include anything
#
# Includes are resolved as the compilers do: beside the including file, then from ROOT (the -I.
# of src/cli), then from cuda/ (the -Icuda of the CUDA builds). System headers (<...>) are not
# part of the graph.
root=${1:-"$(dirname "$0")/.."}
cd "$root" || exit 2
LAYERS="src src/core src/kernels src/io ref src/dist src/engine cuda/emu cuda src/api src/train
src/bench verify src/cli tests"

files=$(find src verify ref cuda tests bench python -type f \
    \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cc' \) \
    ! -path 'tests/fuzz/corpus/*' 2>/dev/null | LC_ALL=C sort)
[ -n "$files" ] || { echo "layers.sh: no sources under $(pwd)" >&2; exit 2; }

# awk reads the file list, then each file; prints one line per problem.
problems=$(printf '%s\n' "$files" | LC_ALL=C awk -v layers="$LAYERS" '
function norm(p,   n, i, k, parts, out, o) {   # "a/b/../c/./d" -> "a/c/d"; "" if it climbs out
    n = split(p, parts, "/"); k = 0
    for (i = 1; i <= n; i++) {
        if (parts[i] == "" || parts[i] == ".") continue
        if (parts[i] == "..") { if (k == 0) return ""; k--; continue }
        out[++k] = parts[i]
    }
    o = ""
    for (i = 1; i <= k; i++) o = o (i > 1 ? "/" : "") out[i]
    return o
}
function dir(p) { return p ~ /\// ? substr(p, 1, match(p, /\/[^\/]*$/) - 1) : "" }
function layer(p,   d) {                       # the layer a file belongs to; "" if none
    if (p ~ /^(tests|bench|python)\// || p ~ /^cuda\/emu\/tests\//) return "tests"
    if (p ~ /^cuda\/emu\//) return "cuda/emu"
    if (p ~ /^src\/[^\/]*$/) return "src"
    if (p ~ /^src\//) { d = p; sub(/^src\//, "", d); sub(/\/.*/, "", d); return "src/" d }
    d = p; sub(/\/.*/, "", d); return d
}
BEGIN {
    n = split(layers, L, /[ \n]+/)
    for (i = 1; i <= n; i++) rank[L[i]] = i
}
{ file[++nf] = $0; have[$0] = 1 }
END {
    for (f = 1; f <= nf; f++) {
        p = file[f]; lp = layer(p)
        if (!(lp in rank)) { print p ": folder \"" lp "\" is not in the layer list of tests/layers.sh"; continue }
        line = 0
        while ((getline s < p) > 0) {
            line++
            if (s !~ /^[ \t]*#[ \t]*include[ \t]*"/) continue
            inc = s; sub(/^[^"]*"/, "", inc); sub(/".*/, "", inc)
            t = norm(dir(p) "/" inc)
            if (!(t in have)) t = norm(inc)
            if (!(t in have)) t = norm("cuda/" inc)
            if (!(t in have)) { print p ":" line ": #include \"" inc "\" names no source file of the tree"; continue }
            lt = layer(t)
            if (!(lt in rank)) { print p ":" line ": includes " t ", whose folder \"" lt "\" is not in the layer list"; continue }
            if (rank[lt] > rank[lp])
                print p ":" line ": " lp " includes " t " from " lt ", a higher layer"
        }
        close(p)
    }
}')
if [ -n "$problems" ]; then
    printf '%s\n' "$problems"
    echo "layers.sh: the include graph breaks the layer order ($(printf '%s\n' "$problems" | wc -l) problems; the order is at the top of tests/layers.sh)"
    exit 1
fi
echo "layers.sh: $(printf '%s\n' "$files" | wc -l) sources, every include goes to its own layer or a lower one"
