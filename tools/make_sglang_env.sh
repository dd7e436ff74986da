#!/usr/bin/env bash
# make_sglang_env.sh [--scheduler] VERSION DEST [REQUIREMENTS_FILE]
#
# Build a fresh Python 3.11 virtual environment at DEST in which sglang VERSION's
# real scheduler module (sglang.srt.managers.schedule_batch) imports on a CPU-only
# machine, following tools/sglang_cpu/README.md (everything it needs is in that
# folder: nothing outside the repository is read):
#   1. pip install torch==2.13.0              (a CPU build, checked: never plain
#                                              `torch`, which may be a multi-GB CUDA build)
#   2. pip install --no-deps -r tools/sglang_cpu/requirements-VERSION.txt
#      (with --scheduler, also requirements-VERSION-scheduler.txt); a release with no
#      file of its own gets requirements-older.txt (transformers 5.12.1 and xgrammar
#      0.2.1, as 0.5.15-0.5.20 pin them; tried on 0.5.18 and 0.5.19) and
#      sglang==VERSION (requirements-older-scheduler.txt with --scheduler);
#   3. the stand-in `torchvision` (tools/sglang_cpu/torchvision_standin.py) copied into
#      site-packages and activated by a .pth file, so every interpreter of the venv
#      (including processes SGLang spawns) gets it before anything imports torchvision;
#   4. a smoke test: import schedule_batch, print the time it took;
#   5. with RELEASES, each release's wheel on top of this one base (torch and the
#      pins once): `pip install --no-deps --target DEST/releases/V sglang==V`, so that
#      `PYTHONPATH=DEST/releases/V DEST/bin/python ...` runs release V's own modules.
#
# Environment / arguments:
#   REQUIREMENTS_FILE (3rd arg) or SGLANG_CPU_REQS   another requirements file to use
#   PYTHON              interpreter to build the venv from; default: `python3.11`, else
#                       pyenv's 3.11.x
#   TORCH_SPEC          default torch==2.13.0
#   FORCE=1             replace DEST if it exists (otherwise refuse)
#   ALLOW_NON_CPU_TORCH=1  skip the check that pip would pick a +cpu torch wheel
#   SKIP_SMOKE=1        skip the final import test
#   RELEASES=V1,V2,...  the releases of step 5 (they import on the older pins: 0.5.11-0.5.22)
set -euo pipefail

usage() { sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
log() { printf '[make_sglang_env %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[[ ${1:-} == -h || ${1:-} == --help ]] && usage 0
SCHEDULER=0
if [[ ${1:-} == --scheduler ]]; then SCHEDULER=1; shift; fi
[[ $# -ge 2 && $# -le 3 ]] || usage 2
VERSION=$1
DEST=$2
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RECIPE_DIR="$SCRIPT_DIR/sglang_cpu"
STANDIN_SRC="$RECIPE_DIR/torchvision_standin.py"
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[[ -f $STANDIN_SRC ]] || die "missing $STANDIN_SRC"

# --- requirements files (the repository's own pins) -------------------------------------
REQS=${3:-${SGLANG_CPU_REQS:-$RECIPE_DIR/requirements-$VERSION.txt}}
OLDER=0
if [[ ! -f $REQS && -z ${3:-} && -z ${SGLANG_CPU_REQS:-} ]]; then
    # no pins of its own: the shared older set, and the release itself
    OLDER=1
    REQS=$(mktemp --suffix=.txt)
    trap 'rm -f "$REQS"' EXIT
    { cat "$RECIPE_DIR/requirements-older.txt"; echo "sglang==$VERSION"; } >"$REQS"
fi
[[ -f $REQS ]] || die "no requirements file $REQS (pinned releases: $(cd "$RECIPE_DIR" \
    && ls requirements-*.txt | grep -v scheduler | sed 's/requirements-//; s/.txt//' | tr '\n' ' '))"
REQS=$(cd "$(dirname "$REQS")" && pwd)/$(basename "$REQS")
grep -qiE "^sglang==$VERSION\s*$" "$REQS" || die "$REQS does not pin sglang==$VERSION"
SCHED_REQS=
if [[ $SCHEDULER == 1 ]]; then
    SCHED_REQS="$RECIPE_DIR/requirements-$VERSION-scheduler.txt"
    [[ $OLDER == 1 ]] && SCHED_REQS="$RECIPE_DIR/requirements-older-scheduler.txt"
    [[ -f $SCHED_REQS ]] || die "--scheduler: no $SCHED_REQS"
fi

# --- interpreter -----------------------------------------------------------------------
pick_python() {
    local c
    for c in "${PYTHON:-}" python3.11 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.11.*/bin/python3.11; do
        [[ -n $c ]] || continue
        if "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; then
            # resolve pyenv shims to the real interpreter so the venv does not depend on them
            "$c" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done
    return 1
}
PY=$(pick_python) || die "no Python 3.11 found (set PYTHON=...)"

# --- fresh venv ------------------------------------------------------------------------
if [[ -e $DEST ]]; then
    [[ ${FORCE:-0} == 1 ]] || die "$DEST exists; use FORCE=1 to replace it"
    log "removing existing $DEST"
    rm -rf -- "$DEST"
fi
mkdir -p "$(dirname "$DEST")"
DEST=$(cd "$(dirname "$DEST")" && pwd)/$(basename "$DEST")
t0=$SECONDS
log "sglang $VERSION -> $DEST (python: $PY, requirements: $REQS)"
"$PY" -m venv "$DEST"
VPY=$DEST/bin/python
pip_() { "$VPY" -m pip --disable-pip-version-check "$@"; }

# --- 1. torch (CPU build) ----------------------------------------------------------------
# Guard against a CUDA torch: ask pip what it would install before installing it.
if [[ ${ALLOW_NON_CPU_TORCH:-0} != 1 ]]; then
    report=$(mktemp)
    pip_ install --quiet --dry-run --no-deps --ignore-installed --report "$report" "$TORCH_SPEC" >/dev/null
    picked=$("$VPY" -c 'import json,sys; r=json.load(open(sys.argv[1]))["install"][0]; print(r["metadata"]["version"], r["download_info"]["url"])' "$report")
    rm -f "$report"
    log "pip would pick torch $picked"
    [[ $picked == *+cpu* ]] || die "pip would install a non-CPU torch ($picked); refusing (ALLOW_NON_CPU_TORCH=1 to override)"
fi
log "1/4 pip install $TORCH_SPEC"
pip_ install "$TORCH_SPEC"

# --- 2. sglang and the packages its scheduler path imports -------------------------------
log "2/4 pip install --no-deps -r $REQS"
pip_ install --no-deps -r "$REQS"
if [[ -n $SCHED_REQS ]]; then
    log "2/4 pip install --no-deps -r $SCHED_REQS"
    pip_ install --no-deps -r "$SCHED_REQS"
fi

# --- 3. the torchvision stand-in, active in every interpreter of this venv ---------------
SITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
log "3/4 torchvision stand-in -> $SITE"
"$VPY" -c 'import importlib.util,sys; sys.exit(importlib.util.find_spec("torchvision") is not None)' \
    || die "a real torchvision got installed into the venv; the stand-in would shadow it"
cp "$STANDIN_SRC" "$SITE/torchvision_standin.py"
# A .pth line starting with "import" is executed by site.py at every interpreter start.
echo 'import torchvision_standin; torchvision_standin.install()' >"$SITE/zz_torchvision_standin.pth"
"$VPY" -m compileall -q "$SITE/torchvision_standin.py"

# pip check: expected to complain (torch older than sglang's pin, --no-deps); log only.
pip_ check >"$DEST/pip-check.txt" 2>&1 || true
log "pip check: $(wc -l <"$DEST/pip-check.txt") lines of complaints (see $DEST/pip-check.txt)"

# --- 4. smoke test ---------------------------------------------------------------------
if [[ ${SKIP_SMOKE:-0} != 1 ]]; then
    log "4/4 import sglang.srt.managers.schedule_batch"
    "$VPY" - <<'EOF'
import sys, time
t = time.perf_counter()
import sglang.srt.managers.schedule_batch as sb  # noqa: E402
dt = time.perf_counter() - t
import sglang, torch, torchvision
assert getattr(torchvision, "__torchvision_standin__", False), "torchvision is not the stand-in"
assert torch.version.cuda is None, "torch is a CUDA build"
print(f"sglang {sglang.__version__}  torch {torch.__version__}  python {sys.version.split()[0]}  "
      f"import schedule_batch: {dt:.1f} s")
EOF
fi
# --- 5. other releases on this base ------------------------------------------------------
if [[ -n ${RELEASES:-} ]]; then
    for release in ${RELEASES//,/ }; do
        log "5/5 sglang==$release -> $DEST/releases/$release (--no-deps)"
        pip_ install --quiet --no-deps --target "$DEST/releases/$release" "sglang==$release"
    done
fi
build_s=$((SECONDS - t0))
size=$(du -sh "$DEST" | cut -f1)
printf 'sglang %s\t%s\tbuilt in %d s\t%s\n' "$VERSION" "$DEST" "$build_s" "$size" | tee "$DEST/BUILD-INFO.txt"
