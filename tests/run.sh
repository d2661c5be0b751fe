#!/bin/sh
# Runs each test binary given on the command line from the repository root; fails if any fails.
cd "$(dirname "$0")/.." || exit 2
status=0
for t in "$@"; do
    echo "== $t"
    "$t" || status=1
done
[ $status -eq 0 ] && echo "all test suites passed" || echo "SOME TEST SUITES FAILED"
exit $status
