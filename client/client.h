#ifndef RINGATTN_CLIENT_CLIENT_H_
#define RINGATTN_CLIENT_CLIENT_H_

// The C++ client library of the ringattn service (proto/ringattn/v1/
// attention.proto): it turns host tensors into the chunked request streams of
// the public API and the streamed output back into whole tensors.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/chunking.h"
#include "core/tensor.h"
#include "grpcpp/grpcpp.h"
#include "ringattn/v1/attention.grpc.pb.h"

namespace ringattn {

// An fp32 host tensor [batch, seq, heads, dim] handed to the client; the
// client reads it during the call and does not keep it.
using HostTensor = View<const float>;

// How far the upload of a request's tensors, or the download of its output,
// has come.
struct Progress {
  enum class Phase { kUpload, kDownload };
  Phase phase = Phase::kUpload;
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
};

struct ClientOptions {
  // Limit on each call, from its start; InfiniteDuration() for none.
  absl::Duration deadline = absl::InfiniteDuration();
  // Upper bound on the tensor bytes of one chunk message (a single token row
  // that is larger goes alone). >= 1. Uploading 1 GB through a local
  // coordinator, 4 MiB chunks cost the client and the coordinator about a
  // tenth less CPU than 1 MiB ones (2 and 8 MiB: in between); the coordinator
  // accepts up to 16 MiB.
  int64_t chunk_bytes = 4 << 20;
  // Sent as "authorization: Bearer <token>" metadata on every call.
  std::optional<std::string> bearer_token;
  // Called as chunks go out and come in: bytes_done rises to bytes_total in
  // each phase, starting with a call at 0. It runs on a gRPC thread, never
  // concurrently with itself for one call; it must be quick and must not call
  // the Client.
  std::function<void(const Progress&)> progress;
  // Whether a call waits (within its deadline) for the server to become
  // reachable instead of failing at once with UNAVAILABLE.
  bool wait_for_ready = false;
  // Longest wait between attempts to (re)connect; InfiniteDuration() leaves
  // gRPC's growing backoff (1 s up to 2 min). Short for a server that is
  // about to start.
  absl::Duration reconnect_backoff = absl::InfiniteDuration();
  // Streams one call (Attend, Query or a context upload) uploads its chunks
  // over, in [0, 64]: the call's own stream and upload_streams - 1
  // AttachUpload streams, each written from a thread of its own over a
  // connection of its own, so that serializing, the transport's framing and
  // parsing run on as many threads at every hop. 0 (the default):
  // kAutoStreams for a call that uploads at least auto_streams_min_bytes,
  // else 1. With N > 1 a streaming source's Next is called from several
  // threads, one call at a time, or, for a source that makes any chunk on
  // demand (ChunkSource::chunk_count), its Fill from several at once, each
  // stream starting at a different place of the tensors.
  int upload_streams = 0;
  // Streams one Attend or Query call's output comes back over, in [0, 64]:
  // the call's own stream and download_streams - 1 AttachDownload streams, each
  // read on a thread of its own over a connection of its own (shared with the
  // upload stream of the same number). 0 (the default): kAutoStreams for a call
  // whose output is at least auto_streams_min_bytes, else 1. Output chunks
  // then arrive in no order across streams: an AttendStreaming consumer is
  // called with each as it comes, one call at a time.
  int download_streams = 0;
  // Where 0 streams above turn into kAutoStreams: queries of 8-32 MiB gain
  // a few milliseconds from four.
  int64_t auto_streams_min_bytes = int64_t{8} << 20;
  // Streams each way of a large call by default: on 2x H200 four moved 7-9
  // GB/s each way where one moves about 1.4.
  static constexpr int kAutoStreams = 4;
  // Attempts an Attend or Query call from whole tensors gets, in [1,
  // kMostAttempts]: one that ends with UNAVAILABLE before any output came
  // back (the coordinator's cluster not ready: a worker died and no
  // replacement has joined yet; a worker failed during the call; the
  // coordinator out of reach) is sent again, whole, after a random wait of
  // 0.25-0.5 s, then twice that each time, up to 4 s. Such a call changed
  // nothing, so sending it again is safe; a query with new rows goes again
  // only when the coordinator itself said so (it took the rows back), never
  // after a lost connection. Each attempt has its own deadline.
  // AttendStreaming and context uploads are never retried.
  int max_attempts = 1;
  static constexpr int kMostAttempts = 5;
  static constexpr absl::Duration kLongestRetryWait = absl::Seconds(4);
  // Channel credentials; null means plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

// What Attend and Query return.
struct AttendResult {
  Tensor<float> output;    // O [batch, q_len, q_heads, head_dim]
  std::vector<float> lse;  // [batch, q_heads, q_len] with return_lse, or empty
  v1::Summary summary;
};

// A connection to one ringattn coordinator. Every method blocks until its call
// completes and returns the service's status as an absl::Status with the same
// code and message; a response that breaks the API's rules (output rows
// missing, repeated or of the wrong size) is INTERNAL or DATA_LOSS. A Client is
// thread-safe: calls from several threads run concurrently over one channel.
class Client {
 public:
  // A client of the service at `target` ("host:port" or any gRPC target).
  // The channel connects lazily: an unreachable target shows as UNAVAILABLE
  // on the first call. INVALID_ARGUMENT for an empty target or bad options.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const std::string& target, ClientOptions options);

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Exact attention of Q [batch, q_len, q_heads, head_dim] against
  // K, V [batch, kv_len, kv_heads, head_dim] under `spec`, whose shape fields
  // must match the tensors (INVALID_ARGUMENT otherwise). Tensors travel in
  // spec.wire_dtype (FP32 where unspecified).
  absl::StatusOr<AttendResult> Attend(const v1::AttentionSpec& spec,
                                      const HostTensor& q, const HostTensor& k,
                                      const HostTensor& v);

  // Attend for tensors too large for host memory: the chunks of Q, K and V
  // (spec's shapes, in spec.wire_dtype, in any order) come from `source`, and
  // each output chunk, once checked (O in spec.output_dtype), goes to
  // `consumer` instead of into a tensor; an error from it ends the call.
  absl::StatusOr<v1::Summary> AttendStreaming(
      const v1::AttentionSpec& spec, ChunkSource& source,
      OutputAssembler::Consumer consumer);

  absl::StatusOr<v1::ClusterInfo> GetClusterInfo();

  // Uploads K and V [batch, length, kv_heads, head_dim] as a new resident
  // context `name`, or appends them to the existing context `name`; returns
  // the context as it stands afterwards.
  absl::StatusOr<v1::ContextInfo> CreateContext(
      const std::string& name, const HostTensor& k, const HostTensor& v,
      v1::DType wire_dtype = v1::FP32);
  absl::StatusOr<v1::ContextInfo> AppendContext(
      const std::string& name, const HostTensor& k, const HostTensor& v,
      v1::DType wire_dtype = v1::FP32);
  // CreateContext (create) or AppendContext for contexts too large for host
  // memory: `header` names the context and gives its shapes and wire dtype,
  // `source` yields the K and V chunks of header.length tokens.
  absl::StatusOr<v1::ContextInfo> UploadContextStreaming(
      bool create, const v1::ContextHeader& header, ChunkSource& source);

  // Attention of Q against the resident context `context`: as Attend, with
  // spec.kv_len ignored.
  absl::StatusOr<AttendResult> Query(const std::string& context,
                                     const v1::AttentionSpec& spec,
                                     const HostTensor& q);
  // A decode step in one call: appends K and V [batch, n, kv_heads, head_dim]
  // to the context, then attends Q to the whole context including them. If
  // the call fails the context is left as it was.
  absl::StatusOr<AttendResult> Query(const std::string& context,
                                     const v1::AttentionSpec& spec,
                                     const HostTensor& q,
                                     const HostTensor& k_new,
                                     const HostTensor& v_new);

  // Query for a Q already in spec.wire_dtype, or too large for host memory:
  // as AttendStreaming, with `source` yielding the Q chunks alone. Nothing is
  // widened or narrowed on this side, so a bf16 caller's rows go out as they
  // are and O comes back in spec.output_dtype. Not retried.
  absl::StatusOr<v1::Summary> QueryStreaming(
      const std::string& context, const v1::AttentionSpec& spec,
      ChunkSource& source, OutputAssembler::Consumer consumer);

  absl::Status DeleteContext(const std::string& name);
  absl::StatusOr<std::vector<v1::ContextInfo>> ListContexts();

 private:
  Client(std::unique_ptr<v1::Attention::Stub> stub,
         std::vector<std::unique_ptr<v1::Attention::Stub>> attached_stubs,
         ClientOptions options);

  // Sets the deadline and metadata of a new call on `context`.
  void Prepare(grpc::ClientContext* context) const;

  // The streams a call moves `bytes` over one way, given the option `asked`
  // (0: automatic).
  int StreamsFor(int asked, int64_t bytes) const;

  // Runs one Attend or Query call whose first message is `header`.
  template <typename Request>
  absl::StatusOr<v1::Summary> Run(Request header, ChunkSource& source,
                                  OutputAssembler& output);

  // Checks the output's shape, then Runs one streaming call.
  template <typename Request>
  absl::StatusOr<v1::Summary> RunStreaming(Request header, ChunkSource& source,
                                           OutputAssembler::Consumer consumer);

  // Runs `attempt` (one whole call, which sets `answered` once output came
  // back) up to options_.max_attempts times while it ends with UNAVAILABLE
  // unanswered (for a call that `appends` rows, only when the coordinator
  // marked it unchanged), waiting between attempts.
  absl::StatusOr<AttendResult> Retrying(
      bool appends,
      absl::FunctionRef<absl::StatusOr<AttendResult>(bool& answered)> attempt)
      const;

  absl::StatusOr<AttendResult> RunQuery(const std::string& context,
                                        const v1::AttentionSpec& spec,
                                        const HostTensor& q,
                                        const HostTensor* k_new,
                                        const HostTensor* v_new);

  absl::StatusOr<v1::ContextInfo> UploadContext(bool create,
                                                const std::string& name,
                                                const HostTensor& k,
                                                const HostTensor& v,
                                                v1::DType wire_dtype);

  std::unique_ptr<v1::Attention::Stub> stub_;
  // The attached streams' connections, one per stream number (AttachUpload
  // and AttachDownload streams of a number share one): streams that share a
  // connection share the one thread that reads it on each side.
  std::vector<std::unique_ptr<v1::Attention::Stub>> attached_stubs_;
  ClientOptions options_;
};

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_CLIENT_H_
