#!/usr/bin/env bash
# Build kvest's extension with AddressSanitizer and UndefinedBehaviorSanitizer
# and run the differential, bad-input, request-object and example tests under
# them, on every CPU variant this machine supports.  Any report fails the run.
#
#   bash tools/sanitize.sh [pytest args...]
#
# Needs gcc (its libasan/libubsan runtimes are preloaded, since the Python
# interpreter itself is not instrumented) and a Python environment with pip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A private copy of the tree (tracked and new files), built in place.
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
    (cd "$root" && xargs -0 cp --parents -t "$work")
cd "$work"
python -m pip install --quiet "Cython>=3.1" "setuptools>=77" "numpy>=2.0" pytest hypothesis

export KVEST_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g"
export KVEST_LDFLAGS="-fsanitize=address,undefined"
if ! python setup.py build_ext --inplace > build.log 2>&1; then
    cat build.log
    exit 1
fi

LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
export LD_PRELOAD
# CPython's own allocations are not ours to judge: no leak report.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export KVEST_REQUIRE_COMPILED=1 PYTHONMALLOC=malloc
# The instrumented build, not a kvest installed in the environment: the src/
# layout keeps the tree off sys.path, so without this pytest would import the
# installed (uninstrumented) kvest -- as it did until this line was added.
export PYTHONPATH="$work/src${PYTHONPATH:+:$PYTHONPATH}"
python - "$work/src/kvest/" <<'PY'
import sys, kvest, kvest._kernels, kvest._reqs, kvest._writes
for module in (kvest, kvest._kernels, kvest._reqs, kvest._writes):
    assert module.__file__.startswith(sys.argv[1]), f"{module.__name__} from {module.__file__}"
print("sanitizers: testing the instrumented build in", sys.argv[1])
PY
# tests/test_hostile.py runs its crash-prone cases in subprocesses: they inherit
# the preloaded runtimes and import this instrumented build.
python -m pytest -q -p no:cacheprovider \
    tests/test_differential.py tests/test_inputs.py tests/test_reqs.py tests/test_examples.py \
    tests/test_hostile.py tests/test_writes.py "$@"
echo "sanitizers: clean"
