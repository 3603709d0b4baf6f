#ifndef RINGATTN_PROTO_RECEIVE_WINDOW_H_
#define RINGATTN_PROTO_RECEIVE_WINDOW_H_

// A fixed HTTP/2 stream window for the data a gRPC server receives, in place
// of the one gRPC grows by probing the bandwidth-delay product. On bare gRPC
// between two processes of one host a fixed 64 MiB window doubled one
// stream's rate (docs/results/h200x2-s20.md); the servers take it as
// --receive_window_mib.

#include <cstdint>

#include "grpcpp/grpcpp.h"

namespace ringattn {

// The most a server may ask for: gRPC caps a stream window below 2 GiB.
inline constexpr int kMostReceiveWindowMib = 1024;

// Fixes the window of the streams `builder`'s server receives on at `mib`
// MiB; 0 leaves gRPC's own. `mib` must be in [0, kMostReceiveWindowMib].
inline void UseReceiveWindow(grpc::ServerBuilder& builder, int mib) {
  if (mib == 0) return;
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             static_cast<int>(int64_t{mib} << 20));
}

}  // namespace ringattn

#endif  // RINGATTN_PROTO_RECEIVE_WINDOW_H_
