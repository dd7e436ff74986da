#!/usr/bin/env bash
# Run core tests under valgrind's memcheck against the installed kvest, and fail
# on any memory error (invalid read or write, uninitialised value, bad free)
# whose stack passes through kvest's compiled code.  Reports from elsewhere --
# the dynamic loader, CPython, NumPy, glibc's vectorized string functions -- are
# listed as a count but do not fail the run: they are not kvest's to fix.
# Valgrind emulates up to AVX2, so the AVX2 and baseline loops are what runs.
#
#   bash tools/memcheck.sh [pytest args...]     (default: worked examples and bad inputs)
set -euo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log" "$log".*' EXIT
# `python "$(command -v pytest)"`, not `python -m pytest`: the installed kvest,
# not the source tree in the current directory.
export PYTHONMALLOC=malloc OPENBLAS_NUM_THREADS=1 KVEST_REQUIRE_COMPILED=1
# The "quick" Hypothesis profile whatever the caller's: under valgrind every
# example runs ~50x slower, and a few reach every code path (the 400-example
# "ci" profile made the request-object run take 16 minutes).
export HYPOTHESIS_PROFILE=quick
args=("$@")
[ ${#args[@]} -gt 0 ] || args=(tests/test_examples.py tests/test_inputs.py)
status=0
# --trace-children: tests/test_hostile.py runs its crash-prone cases in
# subprocesses, which memcheck must watch too (%p: one log per process).
valgrind --tool=memcheck --leak-check=no --num-callers=40 --trace-children=yes \
    --log-file="$log.%p" \
    python "$(command -v pytest)" -q -p no:cacheprovider "${args[@]}" || status=$?
[ "$status" -eq 0 ] || { echo "the tests failed under valgrind (exit $status)"; exit 1; }
cat "$log".* > "$log"
python - "$log" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
blocks = re.split(r"\n==\d+== \n", text)
errors = [b for b in blocks if re.search(r"==\d+== (Invalid|Conditional|Use of uninit|Mismatched|Source and destination|Syscall param|Argument)", b)]
ours = [b for b in errors if re.search(r"_kernels|_reqs|_writes|_glue|reqwrite|reqattr|reqroute|addrorder|loops_body|loops_avx2|loops\.c", b)]
print(f"memcheck: {len(errors)} reports in all, {len(ours)} through kvest's code")
for b in ours:
    print(b)
sys.exit(1 if ours else 0)
PY
echo "memcheck: clean"
