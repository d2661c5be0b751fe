#!/bin/sh
# Runs each test binary given on the command line from the repository root, SBP_TEST_JOBS of them
# at once (default: the number of cores), and prints each one's output in the order given; fails
# if any fails. Every suite works in a temporary directory of its own (tests/testutil.c), so they
# can run side by side; the longest start first.
cd "$(dirname "$0")/.." || exit 2
# OpenMP threads that spin while waiting steal the cores from another process (a test and the
# streambp it runs, and the suite beside it): here, with suites side by side, threads sleep at
# once. streambp's own default spins 1,000 rounds first (src/cli/main.c), which a lone process
# on a quiet VM gains 7x from, but with two suites at a time it lost: test_ref, test_schedules,
# test_gemma3 and test_refgemma two at a time took 96-97 s passive against 121-131 s (2-vCPU
# Zen 3 VM, 2026-12-07, alternated).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# Under make test SAN=1: leaks are errors too (LeakSanitizer, at the exit of every process a
# test runs, Check's forked test processes included).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
jobs="${SBP_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}"
logs=$(mktemp -d) || exit 2
trap 'rm -rf "$logs"' EXIT
slow="test_verify test_ref test_unattended test_plant test_cuda_emu test_schedules test_objectives"
{
    for t in "$@"; do case " $slow " in *" ${t##*/} "*) echo "$t" ;; esac; done
    for t in "$@"; do case " $slow " in *" ${t##*/} "*) ;; *) echo "$t" ;; esac; done
} | xargs -P "$jobs" -I{} sh -c '
    t=$1; log=$2/$(echo "$t" | tr / _); s=$(date +%s)
    if "$t" >"$log" 2>&1; then r=0; else r=1; fi
    echo "$r $(($(date +%s) - s))" >"$log.rc"
    echo "   done: $t ($(($(date +%s) - s)) s)"' _ {} "$logs"
status=0
for t in "$@"; do
    log=$logs/$(echo "$t" | tr / _) secs=
    echo "== $t"
    cat "$log" 2>/dev/null
    read -r r secs <"$log.rc" 2>/dev/null || r=1
    [ "$r" = 0 ] || { status=1; echo "FAILED: $t"; }
    echo "   ($t: ${secs:-?} s)"
done
# The Python helper (python/): the file tests need only the standard library and always run
# where there is a python3 (a failure fails the run); the rest, and the CI example, with
# /usr/bin/python3 (Debian's, whatever python3 comes first on PATH) when it can import torch and
# pytest; skipped, and said so, otherwise, and each suite that needs more (transformers, peft)
# prints why it skipped (-rs). SBP_PYTHON_TESTS=0 leaves all of them out (make test's reruns of
# one suite with other binaries); SBP_PYTHON_TESTS=require (CI) fails the run when torch and
# pytest cannot be imported, so they cannot drop out of CI unseen.
want_py=${SBP_PYTHON_TESTS:-1}
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3 2>/dev/null) || PY=
if [ "$want_py" = 0 ]; then
    :
elif [ -n "$PY" ]; then
    echo "== python/tests/test_files.py (unittest, $PY)"
    PYTHONPATH=python timeout 300 "$PY" -m unittest discover -s python/tests -p 'test_files.py' ||
        { status=1; echo "FAILED: python/tests/test_files.py"; }
else
    echo "== python/tests/test_files.py: skipped (no python3)"
    PY=/usr/bin/python3
fi
if [ "$want_py" = 0 ]; then
    :
elif "$PY" -c "import torch, pytest" 2>/dev/null; then
    echo "== python/tests python/examples (pytest, $PY, STREAMBP=$STREAMBP)"
    s=$(date +%s)
    PYTHONPATH=python timeout 900 "$PY" -m pytest -q -rs -p no:cacheprovider python/tests \
        python/examples || { status=1; echo "FAILED: python/tests python/examples"; }
    echo "   (pytest: $(($(date +%s) - s)) s)"
elif [ "$want_py" = require ]; then
    echo "FAILED: python/tests python/examples: $PY cannot import torch and pytest," \
        "and SBP_PYTHON_TESTS=require (apt-get install python3-torch python3-pytest)"
    status=1
else
    echo "== python/tests python/examples: SKIPPED: $PY cannot import torch and pytest" \
        "(apt-get install python3-torch python3-pytest)"
fi
[ $status -eq 0 ] && echo "all test suites passed" || echo "SOME TEST SUITES FAILED"
exit $status
