#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (and the seed corpus generator) with
# clang, libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer, straight
# from the sources they need, into .cache/fuzz/bin/. Bazel's gcc build is left
# alone; the system protobuf and abseil link as they do there. Objects are
# rebuilt when their source or any header of the tree is newer, binaries when
# an object is.
#
#   fuzz/build.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CXX=${CXX:-clang++-14}
OUT=.cache/fuzz
GEN=$OUT/gen
OBJ=$OUT/obj
BIN=$OUT/bin
TARGETS=(npy_fuzzer output_assembler_fuzzer request_stream_fuzzer
  shard_rows_fuzzer)
# The code under test and what it pulls in.
SOURCES=(
  client/chunking.cc client/npy.cc
  core/attention_spec.cc core/block_mask.cc core/dilated.cc core/dtype.cc
  core/hilbert.cc core/large_buffers.cc core/ring_plan.cc core/shard_layout.cc
  core/typed_tensor.cc
  proto/spec_conversion.cc
  server/chunk_routing.cc server/request_layout.cc server/row_coverage.cc
  worker/shard_rows.cc
  "$GEN/ringattn/v1/attention.pb.cc" "$GEN/ringattn/v1/worker.pb.cc"
)
SANITIZE=(-fsanitize=address,undefined -fno-sanitize-recover=all)
CXXFLAGS=(-std=c++17 -O1 -g -fno-omit-frame-pointer "${SANITIZE[@]}"
  -I. -I"$GEN")
# As third_party/system.BUILD links them.
LIBS=(-lprotobuf -labsl_statusor -labsl_status -labsl_cord -labsl_cord_internal
  -labsl_cordz_info -labsl_cordz_handle -labsl_cordz_functions
  -labsl_str_format_internal -labsl_strings -labsl_strings_internal
  -labsl_synchronization -labsl_time -labsl_time_zone -labsl_int128
  -labsl_raw_logging_internal -labsl_base -labsl_throw_delegate -lpthread)

mkdir -p "$GEN" "$OBJ" "$BIN"
for proto in attention worker; do
  if [ ! "$GEN/ringattn/v1/$proto.pb.cc" -nt "proto/ringattn/v1/$proto.proto" ]; then
    protoc --proto_path=proto --cpp_out="$GEN" "proto/ringattn/v1/$proto.proto"
  fi
done

newest_header=$(find client core proto server worker fuzz "$GEN" -name '*.h' \
  -printf '%T@ %p\n' | sort -n | tail -n 1 | cut -d' ' -f2)
compile() {  # source, object, extra flags
  if [ "$2" -nt "$1" ] && [ "$2" -nt "$newest_header" ]; then return 0; fi
  "$CXX" "${CXXFLAGS[@]}" "${@:3}" -c "$1" -o "$2"
}

link() {  # binary, then the inputs and flags of its link command
  local input stale=0
  [ -f "$1" ] || stale=1
  for input in "${@:2}"; do
    if [ -f "$input" ] && [ "$input" -nt "$1" ]; then stale=1; fi
  done
  if [ $stale -eq 1 ]; then "$CXX" "${CXXFLAGS[@]}" "${@:2}" -o "$1"; fi
}

objects=()
for source in "${SOURCES[@]}"; do
  object=$OBJ/$(echo "${source#"$GEN"/}" | tr / _).o
  compile "$source" "$object" -fsanitize=fuzzer-no-link
  objects+=("$object")
done
# Uses libFuzzer's own mutator, so it links into the targets only.
compile fuzz/proto_mutator.cc "$OBJ/proto_mutator.o" -fsanitize=fuzzer-no-link
for target in "${TARGETS[@]}"; do
  compile "fuzz/$target.cc" "$OBJ/$target.o" -fsanitize=fuzzer-no-link
  link "$BIN/$target" -fsanitize=fuzzer "$OBJ/$target.o" \
    "$OBJ/proto_mutator.o" "${objects[@]}" "${LIBS[@]}"
done
compile fuzz/make_seeds.cc "$OBJ/make_seeds.o"
link "$BIN/make_seeds" "$OBJ/make_seeds.o" "${objects[@]}" "${LIBS[@]}"
