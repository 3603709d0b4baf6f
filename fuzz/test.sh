#!/usr/bin/env bash
# The short fuzz run of `./dev test`: builds the fuzz targets, runs each for
# SECONDS (fuzz/run.sh) and writes one JUnit XML per target, DIR/TARGET.xml,
# one test case that fails on a crash, leak, timeout or broken invariant. The
# random seed, the executions and any crashing input are in the XML and on
# stdout. Exits non-zero if any target failed.
#
#   fuzz/test.sh SECONDS DIR
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 2 ]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
seconds=$1
dir=$2
mkdir -p "$dir"
fuzz/build.sh

xml_escape() {
  sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g' |
    tr -cd '\11\12\15\40-\176'
}

status=0
for source in fuzz/*_fuzzer.cc; do
  target=$(basename "$source" .cc)
  log=$dir/$target.log
  rc=0
  # A hung run still ends: libFuzzer's -timeout catches a slow input, this a
  # stuck process.
  timeout $((seconds + 60)) fuzz/run.sh "$target" "$seconds" >"$log" 2>&1 ||
    rc=$?
  seed=$(sed -n 's/^INFO: Seed: \([0-9]*\).*/\1/p' "$log" | head -n 1)
  runs=$(sed -n 's/^stat::number_of_executed_units: \([0-9]*\).*/\1/p' "$log")
  summary="${seconds}s, seed ${seed:-?}, ${runs:-?} executions"
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites><testsuite name=\"$target\" tests=\"1\">"
    echo "<testcase classname=\"libFuzzer\" name=\"$target\" time=\"$seconds\">"
    if [ $rc -ne 0 ]; then
      echo "<failure message=\"exit status $rc ($summary)\">"
      tail -n 60 "$log" | xml_escape
      echo "</failure>"
    fi
    echo "<system-out>$summary</system-out>"
    echo "</testcase></testsuite></testsuites>"
  } >"$dir/$target.xml"
  if [ $rc -ne 0 ]; then
    status=1
    echo "FUZZ FAILED $target ($summary):"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error|artifact_prefix)' "$log" |
      head -n 10
  else
    echo "fuzz $target: $summary"
  fi
done
exit $status
