#!/bin/sh
# layers.sh [ROOT [OBJDIR]] — the tree's two graphs against the layer order below, ROOT the
# repository by default:
#   includes  every #include "..." of a source: a file may include its own layer and the layers
#             BELOW it, never one above (so the folders' include graph has no cycle either);
#   calls     with OBJDIR (a build directory: build, build-san, ...), every global symbol an
#             object uses and another object of the tree defines (nm): a call or a reference to
#             data. A file may use its own layer and the layers below, never one above, and no
#             two files may use each other — a pair that does is one piece cut in two, or a
#             callback spelt as a call (pass a function pointer, or move the shared part down).
#             Objects map back to their sources: OBJDIR/{common,f32,f64,emu32,emu64,emu}/P.o is
#             P.c, P.cu or P.cc, OBJDIR/cuda/registry.o is cuda/registry.cc; tests, the generated
#             golden data and the nvcc objects (the emulator's twins) are not part of it.
# Run by `make test` (with its build directory); exits 1 naming each upward include or use, each
# pair of files that use each other, an include that names no file of the tree, or a folder not
# in the list; 2 when OBJDIR holds no object; 0 otherwise.
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
objdir=${2:-}
cd "$root" || exit 2
LAYERS="src src/core src/kernels src/io ref src/dist src/engine cuda/emu cuda src/api src/train
src/bench verify src/cli tests"

files=$(find src verify ref cuda tests bench python -type f \
    \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.cc' \) \
    ! -path 'tests/fuzz/corpus/*' 2>/dev/null | LC_ALL=C sort)
[ -n "$files" ] || { echo "layers.sh: no sources under $(pwd)" >&2; exit 2; }

# The awk functions both checks use: paths, and the layer a path belongs to.
AWKLIB='
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
'

# awk reads the file list, then each file; prints one line per problem.
problems=$(printf '%s\n' "$files" | LC_ALL=C awk -v layers="$LAYERS" "$AWKLIB"'
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
# The calls: nm -P -A prints "OBJECT: SYMBOL TYPE [VALUE SIZE]"; U is a use, an upper-case type
# a definition (static symbols are lower-case: a file's own business). The object's path names
# its source; a symbol defined in several sources (C++ inline functions) is nobody's.
if [ -n "$objdir" ]; then
    objs=$(find "$objdir/common" "$objdir/f32" "$objdir/f64" "$objdir/emu32" "$objdir/emu64" \
        "$objdir/emu" "$objdir/cuda" -name '*.o' ! -path '*/tests/*' 2>/dev/null | LC_ALL=C sort)
    [ -n "$objs" ] || { echo "layers.sh: no objects under $objdir (build it first)" >&2; exit 2; }
    # shellcheck disable=SC2086 # one object path per word
    calls=$(nm -P -A $objs 2>/dev/null | LC_ALL=C awk -v layers="$LAYERS" -v objdir="$objdir" \
        -v files="$(printf '%s\n' "$files")" "$AWKLIB"'
function source_of(o,   rel, rest, i, ext) {   # OBJDIR/kind/P.o -> P.c | P.cu | P.cc; "" if none
    rel = substr(o, length(objdir) + 2); sub(/\.o:?$/, "", rel)
    rest = rel; sub(/^[^\/]*\//, "", rest)
    for (i = 1; i <= 3; i++) {
        ext = i == 1 ? ".c" : i == 2 ? ".cu" : ".cc"
        if ((rest ext) in have) return rest ext
        if ((rel ext) in have) return rel ext
    }
    return ""
}
BEGIN { n = split(files, F, "\n"); for (i = 1; i <= n; i++) have[F[i]] = 1 }
{
    if (!($1 in src)) src[$1] = source_of($1)
    s = src[$1]
    if (s == "") next
    if ($3 == "U") { nu++; user[nu] = s; used[nu] = $2; next }
    if ($3 !~ /^[A-TV-Z]$/) next
    if (!($2 in def)) def[$2] = s
    else if (def[$2] != s) def[$2] = "*"        # defined in two sources: nobody'"'"'s
}
END {
    for (i = 1; i <= nu; i++) {
        d = def[used[i]]; u = user[i]
        if (d == "" || d == "*" || d == u) continue
        if (!((u SUBSEP d) in edge)) { edge[u, d] = used[i]; ne++; eu[ne] = u; ed[ne] = d }
    }
    for (i = 1; i <= ne; i++) {
        u = eu[i]; d = ed[i]; lu = layer(u); ld = layer(d)
        if (!(lu in rank) || !(ld in rank)) continue   # the include check names such folders
        if (rank[ld] > rank[lu])
            print u ": " lu " uses " edge[u, d] " of " d " from " ld ", a higher layer"
        else if ((d SUBSEP u) in edge && u < d)
            print u " and " d " use each other: " u " uses " edge[u, d] ", " d " uses " edge[d, u]
    }
}' | LC_ALL=C sort)
    problems=$(printf '%s\n%s' "$problems" "$calls" | sed '/^$/d')
fi
if [ -n "$problems" ]; then
    printf '%s\n' "$problems"
    echo "layers.sh: the tree breaks the layer order ($(printf '%s\n' "$problems" | wc -l) problems; the order is at the top of tests/layers.sh)"
    exit 1
fi
echo "layers.sh: $(printf '%s\n' "$files" | wc -l) sources, every include goes to its own layer or a lower one"
[ -z "$objdir" ] || echo "layers.sh: $(printf '%s\n' "$objs" | wc -l) objects under $objdir, every use goes to its own layer or a lower one, and no two files use each other"
