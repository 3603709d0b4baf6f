#!/usr/bin/env bash
# Runs one fuzz target for SECONDS on one core, after building it
# (fuzz/build.sh). It starts from the committed seeds (fuzz/corpus/TARGET) and
# what earlier runs found (.cache/fuzz/corpus/TARGET, where new inputs go);
# a crashing input lands in .cache/fuzz/artifacts/ and the exit status is
# non-zero. FUZZ_SEED fixes libFuzzer's random seed (default: a fresh one,
# printed as "Seed:"). fuzz/varints.dict seeds the mutations. Further
# arguments go to libFuzzer.
#
#   fuzz/run.sh TARGET SECONDS [-flag=value...]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 2 ]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
target=$1
seconds=$2
[ -f "fuzz/$target.cc" ] || { echo "no fuzz target fuzz/$target.cc" >&2; exit 2; }
fuzz/build.sh
mkdir -p ".cache/fuzz/corpus/$target" .cache/fuzz/artifacts
exec ".cache/fuzz/bin/$target" -max_total_time="$seconds" -timeout=10 \
  -rss_limit_mb=2048 -seed="${FUZZ_SEED:-0}" -print_final_stats=1 \
  -artifact_prefix=".cache/fuzz/artifacts/$target-" -dict=fuzz/varints.dict \
  "${@:3}" \
  ".cache/fuzz/corpus/$target" "fuzz/corpus/$target"
