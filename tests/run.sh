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
    "$t" || status=1
done
[ $status -eq 0 ] && echo "all test suites passed" || echo "SOME TEST SUITES FAILED"
exit $status
