#!/bin/sh
# Runs each test binary given on the command line from the repository root, SBP_TEST_JOBS of them
# at once (default: the number of cores), and prints each one's output in the order given; fails
# if any fails. Every suite works in a temporary directory of its own (tests/testutil.c), so they
# can run side by side.
cd "$(dirname "$0")/.." || exit 2
jobs="${SBP_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}"
# Two kinds of suite. Those of `solo` run the verifier, which runs 2 threads in places whatever the
# default (its thread group): beside another suite each of those barriers waits for a core the
# other holds, so they run first, one at a time, with every core. The rest run SBP_TEST_JOBS at a time
# with one OpenMP thread each unless a test asks for more (--threads, sbp_set_threads): the
# suites take the cores already, and a second thread would only wait for a core the suite beside
# it holds. Threads that wait do as streambp's default: 1,000 rounds of spin, then sleep
# (src/cli/main.c). Measured on the 2-vCPU Zen 3 VM (2026-12-07): test_verify and test_plant
# side by side at one thread took 240 s, one after the other with 2 threads 86 + 58 s;
# test_verifygolden, test_reach and test_selftest 79, 45 and 39 s side by side, 23, 15 and 10 s
# alone; test_cuda_emu, test_plan, test_unattended and test_sumblocks 107, 94, 68 and 41 s side
# by side, 100, 78, 69 and 32 s alone (so side by side they finish sooner).
solo="test_verify test_plant test_verifygolden test_reach test_selftest"
if [ -z "${OMP_WAIT_POLICY-}${GOMP_SPINCOUNT-}${KMP_BLOCKTIME-}" ]; then
    export GOMP_SPINCOUNT=1000 KMP_BLOCKTIME=1
fi
# Under make test SAN=1: leaks are errors too (LeakSanitizer, at the exit of every process a
# test runs, Check's forked test processes included).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
logs=$(mktemp -d) || exit 2
trap 'rm -rf "$logs"' EXIT
# One suite: its output to $logs/<name>, its status and seconds to <name>.rc.
run_one='t=$1; log=$2/$(echo "$t" | tr / _); s=$(date +%s)
    if "$t" >"$log" 2>&1; then r=0; else r=1; fi
    echo "$r $(($(date +%s) - s))" >"$log.rc"
    echo "   done: $t ($(($(date +%s) - s)) s)"'
for t in "$@"; do
    case " $solo " in *" ${t##*/} "*) sh -c "$run_one" _ "$t" "$logs" ;; esac
done
# SBP_BESIDE: a command started beside the rest of the suites (make test: tests/mpi_ranks.sh,
# whose ranks mostly wait on mpirun's start-ups and each other: 215 s of wall for about 50 s of
# CPU when it ran after the suites, Zen 3 VM, 2026-12-07); its output follows theirs, and its
# failure fails the run.
beside_pid=
if [ -n "${SBP_BESIDE-}" ]; then
    sh -c "$SBP_BESIDE" >"$logs/beside" 2>&1 &
    beside_pid=$!
fi
# the rest, the longest first
slow="test_ref test_unattended test_cuda_emu test_plan test_schedules test_objectives"
{
    for t in "$@"; do case " $slow " in *" ${t##*/} "*) echo "$t" ;; esac; done
    for t in "$@"; do case " $slow $solo " in *" ${t##*/} "*) ;; *) echo "$t" ;; esac; done
} | {
    if [ "$jobs" -gt 1 ]; then export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"; fi
    xargs -P "$jobs" -I{} sh -c "$run_one" _ {} "$logs"
}
status=0
for t in "$@"; do
    log=$logs/$(echo "$t" | tr / _) secs=
    echo "== $t"
    cat "$log" 2>/dev/null
    read -r r secs <"$log.rc" 2>/dev/null || r=1
    [ "$r" = 0 ] || { status=1; echo "FAILED: $t"; }
    echo "   ($t: ${secs:-?} s)"
done
if [ -n "$beside_pid" ]; then
    wait "$beside_pid"
    r=$?
    cat "$logs/beside"
    [ $r = 0 ] || { status=1; echo "FAILED: $SBP_BESIDE"; }
fi
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
