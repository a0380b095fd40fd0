#!/usr/bin/env bash
# The one prepared GPU run: environment facts, the CUDA tests, and the three GPU benchmarks.
#
#   bash benchmarks/gpu/run.sh [--device cuda|cpu] [--quick] [--out DIR] [--tests "PATHS"]
#   bash benchmarks/gpu/run.sh --prepare   # on the development machine, before the GPU run:
#                                          # fetches the wheels into .whl/ (pip download from
#                                          # PyPI, --no-deps) and stamps (as --stamp)
#   bash benchmarks/gpu/run.sh --stamp     # writes .whl/COMMIT (commit + code digest)
#
# Run from anywhere (it changes to the repository root). Steps, each under its own `timeout`
# (a failing or hanging step cannot eat the others' time), each one's output prefixed with the
# time and appended to DIR/run.log as well as printed:
#   (a) env          benchmarks/gpu/environment.py            -> DIR/env.json
#   (b) tests        pytest -q tests/core tests/devices        -> DIR/junit.xml  (or --tests;
#                    on CUDA only those that touch it: -k "cuda or triton or fused_attention")
#       prewarm      benchmarks/gpu/prewarm.py, in the background beside the tests: compiles
#                    the benchmarks' Triton kernels (AdaSplash's autotuning configurations split
#                    over worker processes) into the Triton cache; waited for after the tests
#   (c) normalizers  benchmarks/gpu/normalizers.py             -> DIR/normalizers.json
#   (d) attention    benchmarks/gpu/attention.py               -> DIR/attention.json
#   (e) transformer  benchmarks/gpu/transformer.py             -> DIR/transformer.json
# then a summary (step, status, seconds) printed and written to DIR/summary.json: 7 files in DIR.
# DIR: --out, else $OUT (the GPU machine's), else results/benchmarks/gpu-rehearsal.
#
# Packages the machine lacks travel as wheels in .whl/ (git-ignored; `carry` it): they are
# installed with pip --no-index --no-deps --target into a fresh temporary folder (or unzipped
# there when pip is missing: they are pure-Python wheels) that goes first on PYTHONPATH, followed
# by the repository root. Nothing here needs the network. The interpreter is ${PYTHON:-python3}.
# Limits (seconds), from the H100 run of 2026-11-26 (results/benchmarks/gpu_run.log) where one
# was measured: env 30 (it took 13 s of a 15 s limit there; env.json is written after every
# section, so a cut keeps what was read); tests 150 (unmeasured on 8 pytest-xdist workers; one
# process needed 193 s with a warm Triton cache: the limit keeps the run in its call, the
# junit.xml says which tests ran); prewarm 120 beside the tests; normalizers 30 (29 s there for
# 5 rounds, now 3); attention 65 (52 s there for 5 rounds and L = 1024, 4096, 16384; now 3
# rounds without L = 1024 but with AdaSplash v1 beside v2 and a profiled kernel time per row:
# unmeasured); transformer 50 (one round per precision, float32, TF32 and bf16, each of 6
# updates and 64 sentences, ~0.6 of the work of a round there, which took 19 s first and 13 s
# after; JSON rewritten after each precision; TF32 and bf16 unmeasured). A step past its limit
# gets SIGINT (Python raises KeyboardInterrupt: pytest writes its junit.xml, a benchmark keeps
# the JSON of the rounds it finished), then SIGKILL 10 s (tests) or 5 s (the others) later.
# Sum of the limits: 30 + 150 + 30 + 65 + 50 = 325 s; with every step killed after its grace
# 355 s: the run fits a 360 s `run` call (the wheel install takes seconds). Override a step's
# limit with TIMEOUT_<STEP>=seconds (e.g. TIMEOUT_TESTS=300).
# Triton's cache: $TRITON_CACHE_DIR, else a fresh folder beside the wheels' (shared by the steps).
# Exit status: the number of steps that did not pass (0: all passed).
set -u
set -o pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
ROOT=$PWD
PYTHON=${PYTHON:-python3}
DEVICE=cuda
QUICK=0
DIR=${OUT:-}
TESTS=""
STAMP=0
PREPARE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --quick) QUICK=1; shift ;;
        --out) DIR=$2; shift 2 ;;
        --tests) TESTS=$2; shift 2 ;;
        --stamp) STAMP=1; shift ;;
        --prepare) PREPARE=1; shift ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' \
            "${BASH_SOURCE[0]}"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "--device must be cuda or cpu" >&2; exit 2 ;; esac
# The wheels the GPU machine lacks (pure Python; pinned: the versions of the first run).
PREPARED_WHEELS=(adasplash==0.2.2 entmax==1.3 pytest-xdist==3.6.1 execnet==2.1.1)
if [ "$PREPARE" = 1 ]; then
    mkdir -p .whl || exit 2
    "$PYTHON" -m pip download --no-deps --only-binary=:all: --dest .whl \
        --disable-pip-version-check "${PREPARED_WHEELS[@]}" || exit 2
    ls -l .whl
    STAMP=1
fi
if [ "$STAMP" = 1 ]; then
    exec "$PYTHON" benchmarks/gpu/environment.py --stamp
fi
DIR=${DIR:-results/benchmarks/gpu-rehearsal}
mkdir -p "$DIR" || exit 2
DIR=$(cd "$DIR" && pwd)
LOG=$DIR/run.log
: > "$LOG"
export PYTHONUNBUFFERED=1
# A CPU rehearsal on a small shared machine: one intra-op thread (OpenMP threads that spin at
# barriers on oversubscribed cores made every op of the tiny model take milliseconds).
if [ "$DEVICE" = cpu ]; then
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
export PYTHONDONTWRITEBYTECODE=1
START=$SECONDS

say() {
    printf '[%(%H:%M:%S)T +%4ds] %s\n' -1 "$((SECONDS - START))" "$*" | tee -a "$LOG"
}

# Prefix every line of a step's output with the time and the step's name, print it and log it.
stamp_lines() {
    local name=$1 line
    while IFS= read -r line; do
        printf '[%(%H:%M:%S)T %s] %s\n' -1 "$name" "$line"
    done | tee -a "$LOG"
}

# ---------------------------------------------------------------- wheels and PYTHONPATH
SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-bench-site.XXXXXX") || exit 2
trap 'rm -rf "$SITE"' EXIT
shopt -s nullglob
WHEELS=(.whl/*.whl)
shopt -u nullglob
if [ ${#WHEELS[@]} -gt 0 ]; then
    say "installing ${#WHEELS[@]} wheel(s) from .whl into $SITE: ${WHEELS[*]##*/}"
    if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --disable-pip-version-check --target "$SITE" "${WHEELS[@]}" 2>&1 | tee -a "$LOG"; then
        say "pip failed or is missing: unzipping the wheels instead"
        "$PYTHON" - "$SITE" "${WHEELS[@]}" <<'EOF' 2>&1 | tee -a "$LOG"
import sys
import zipfile

for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])
EOF
    fi
else
    say "no wheels in .whl: adasplash and entmax must already be importable"
fi
export PYTHONPATH="$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$SITE/triton-cache}
say "python: $(command -v "$PYTHON") ($("$PYTHON" -V 2>&1)); device $DEVICE; quick $QUICK; out $DIR"

# ---------------------------------------------------------------- steps
declare -a NAMES=() STATUS=() TIMES=()

# The limit of step NAME: $TIMEOUT_<NAME> if set, else the default given.
limit_of() {
    local var="TIMEOUT_${1^^}"
    echo "${!var:-$2}"
}

# record NAME RC LIMIT BEGIN [END]: the status of a finished step (END: when it ended, default now).
record() {
    local name=$1 rc=$2 limit=$3 begin=$4 end=${5:-$SECONDS} status=ok
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        status="timeout(${limit}s)"
    elif [ "$rc" != 0 ]; then
        status="failed(rc=$rc)"
    fi
    NAMES+=("$name")
    STATUS+=("$status")
    TIMES+=("$((end - begin))")
    say "=== step $name: $status in $((end - begin))s"
}

# The seconds between a step's SIGINT and its SIGKILL: pytest's xdist workers stop and the
# junit.xml is written; a benchmark stops at once (its JSON is written after every round).
grace_of() {
    if [ "$1" = tests ]; then echo 10; else echo 5; fi
}

# step NAME SECONDS COMMAND...: run under `timeout` (SIGINT to its process group, SIGKILL
# `grace_of NAME` seconds later).
step() {
    local name=$1 limit begin
    limit=$(limit_of "$1" "$2")
    shift 2
    say "=== step $name (timeout ${limit}s): $*"
    begin=$SECONDS
    timeout --signal=INT --kill-after="$(grace_of "$name")" "$limit" "$@" < /dev/null 2>&1 \
        | stamp_lines "$name"
    record "$name" "${PIPESTATUS[0]}" "$limit" "$begin"
}

# background NAME SECONDS COMMAND...: the same, started in the background; `finish NAME` waits.
background() {
    local name=$1 limit
    limit=$(limit_of "$1" "$2")
    shift 2
    say "=== step $name (background, timeout ${limit}s): $*"
    BG_BEGIN=$SECONDS
    BG_LIMIT=$limit
    (
        timeout --signal=INT --kill-after="$(grace_of "$name")" "$limit" "$@" < /dev/null 2>&1 \
            | stamp_lines "$name"
        echo "${PIPESTATUS[0]} $SECONDS" > "$SITE/$name.rc"
    ) &
    BG_PID=$!
}

finish() {
    local rc end
    wait "$BG_PID"
    read -r rc end < "$SITE/$1.rc" || rc=255
    record "$1" "${rc:-255}" "$BG_LIMIT" "$BG_BEGIN" "${end:-$SECONDS}"
}

if [ "$QUICK" = 1 ]; then
    NORM_ARGS=(--rows 64 --dims 64 256 --rounds 3 --repeats 1)
    ATTN_ARGS=(--lengths 128 256 --shapes 128:1x2 256:1x2 --rounds 3 --repeats 1)
    TRANS_ARGS=(--quick)
    WARM_ARGS=(--quick --workers 2)
else
    NORM_ARGS=(--rows 2048 --dims 1024 4096 --rounds 3 --repeats 3)
    ATTN_ARGS=(--lengths 4096 16384 --shapes 4096:1x8 16384:1x2 --rounds 3 --repeats 3)
    TRANS_ARGS=(--rounds 1 --train-steps 6 --infer-sentences 64)
    WARM_ARGS=(--workers 6)
fi
if [ -z "$TESTS" ]; then
    for path in tests/core tests/devices; do
        [ -e "$path" ] && TESTS="$TESTS $path"
    done
fi

step env 30 "$PYTHON" benchmarks/gpu/environment.py --out "$DIR/env.json"
background prewarm 120 "$PYTHON" benchmarks/gpu/prewarm.py --device "$DEVICE" "${WARM_ARGS[@]}"
# shellcheck disable=SC2086  # TESTS is a list of paths
# On CUDA only the tests that touch it (the CPU ones are CI's); every failure, not the first.
if [ "$DEVICE" = cuda ]; then SELECT=(-k "cuda or triton or fused_attention"); else SELECT=(); fi
# Parallel where pytest-xdist is there (a wheel of --prepare) and on CUDA (16 cores compile).
if [ "$DEVICE" = cuda ] && "$PYTHON" -c "import xdist" 2>/dev/null; then SELECT+=(-n 8); fi
step tests 150 "$PYTHON" -m pytest -q -p no:cacheprovider "${SELECT[@]}" \
    --junitxml="$DIR/junit.xml" $TESTS
finish prewarm
step normalizers 30 "$PYTHON" benchmarks/gpu/normalizers.py --device "$DEVICE" "${NORM_ARGS[@]}" \
    --out "$DIR/normalizers.json"
step attention 65 "$PYTHON" benchmarks/gpu/attention.py --device "$DEVICE" "${ATTN_ARGS[@]}" \
    --out "$DIR/attention.json"
step transformer 50 "$PYTHON" benchmarks/gpu/transformer.py --device "$DEVICE" "${TRANS_ARGS[@]}" \
    --out "$DIR/transformer.json"

# ---------------------------------------------------------------- summary
say "=== summary (total $((SECONDS - START))s)"
FAILED=0
{
    printf '{\n  "device": "%s",\n  "quick": %s,\n  "total_seconds": %d,\n  "steps": [\n' \
        "$DEVICE" "$([ "$QUICK" = 1 ] && echo true || echo false)" "$((SECONDS - START))"
    for i in "${!NAMES[@]}"; do
        sep=","
        [ "$i" = $((${#NAMES[@]} - 1)) ] && sep=""
        printf '    {"step": "%s", "status": "%s", "seconds": %d}%s\n' \
            "${NAMES[$i]}" "${STATUS[$i]}" "${TIMES[$i]}" "$sep"
    done
    printf '  ]\n}\n'
} > "$DIR/summary.json"
for i in "${!NAMES[@]}"; do
    say "$(printf '%-12s %-18s %4ss' "${NAMES[$i]}" "${STATUS[$i]}" "${TIMES[$i]}")"
    [ "${STATUS[$i]}" = ok ] || FAILED=$((FAILED + 1))
done
say "files in $DIR: $(cd "$DIR" && ls | tr '\n' ' ')"
say "$((${#NAMES[@]} - FAILED))/${#NAMES[@]} steps passed"
exit "$FAILED"
