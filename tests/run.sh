#!/bin/sh
# Runs each test binary given on the command line from the repository root; fails if any fails.
cd "$(dirname "$0")/.." || exit 2
# OpenMP threads that spin while waiting steal the cores from another process (a test and the
# streambp it runs); passive waiting costs nothing measurable here and keeps runs predictable.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
# Under make test SAN=1: leaks are errors too (LeakSanitizer, at the exit of every process a
# test runs, Check's forked test processes included).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
status=0
for t in "$@"; do
    echo "== $t"
    t0=$(date +%s)
    "$t" || { status=1; echo "FAILED: $t"; }
    echo "   ($t: $(($(date +%s) - t0)) s)"
done
# The Python helper (python/): its tests and the CI example, with /usr/bin/python3 when it can
# import torch and pytest; skipped, and said so, otherwise.
PY=/usr/bin/python3
if "$PY" -c "import torch, pytest" 2>/dev/null; then
    echo "== python/tests python/examples (pytest, STREAMBP=$STREAMBP)"
    PYTHONPATH=python "$PY" -m pytest -q -rs -p no:cacheprovider python/tests python/examples ||
        status=1
else
    echo "== python/tests python/examples: SKIPPED: $PY cannot import torch and pytest" \
        "(apt-get install python3-torch python3-pytest)"
fi
[ $status -eq 0 ] && echo "all test suites passed" || echo "SOME TEST SUITES FAILED"
exit $status
