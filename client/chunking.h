#ifndef RINGATTN_CLIENT_CHUNKING_H_
#define RINGATTN_CLIENT_CHUNKING_H_

// The wire form of tensors in the public API: splitting host tensors into
// TensorChunk messages of whole token rows, and reassembling output and LSE
// from OutputChunk messages. Pure data transformations with no gRPC calls;
// the Client streams what these produce. None of the types is thread-safe.

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "ringattn/v1/attention.pb.h"

namespace ringattn {

// Where the TensorChunks of an upload come from, one at a time, so that
// memory stays at one chunk whatever the tensor size: ChunkStream for host
// tensors, or a caller's own source that reads or generates rows as they go.
// A source may also make any of its chunks on demand (chunk_count() >= 0
// and Fill): several upload streams then each start at a different place of
// the tensors, so that they carry rows for different workers at once, and
// fill their chunks in parallel (SharedChunks).
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // Fills `chunk` with the next chunk, reusing its buffers, and returns true;
  // returns false once every chunk has been handed out, and on every call
  // after that.
  virtual bool Next(v1::TensorChunk* chunk) = 0;
  // Data bytes of all chunks, for progress reports.
  virtual int64_t total_bytes() const = 0;
  // How many chunks there are if Fill can make any of them (the sequence is
  // fixed from the first call on), or -1: only Next, in order.
  virtual int64_t chunk_count() { return -1; }
  // Fills `chunk` with chunk `index` of the chunk_count() (the one the
  // index-th Next would give); safe to call from several threads at once.
  // Only for sources whose chunk_count() is not -1.
  virtual void Fill(int64_t index, v1::TensorChunk* chunk) const {}
};

inline constexpr int64_t kLeastSplitChunkBytes = int64_t{128} << 10;

// The most wire bytes a chunk of an upload of `total_bytes` carries, under
// the client's `chunk_bytes`: an upload under 128 MiB goes in smaller chunks,
// about a thirty-second of it each but not under kLeastSplitChunkBytes. The
// coordinator forwards a chunk's rows to the workers while the client still
// sends the next, so the hops overlap instead of each waiting for the whole
// upload, and each of several streams carries several (2x H200: a 256-row
// query, 2 MB, took 11.5-11.7 ms in 256 KiB chunks against 12.7-13.3 in one;
// one H200: a 4096-row query, 32 MiB over 4 streams, 476-479 ms in 1 MiB
// chunks against 483-486 in 4 MiB ones). Each message costs about 14 us over
// the two hops (one H200 host: the rows of a 256-row query took 0.3 ms longer
// to reach the worker in 64 KiB chunks than in 256 KiB ones), so chunks stay
// above 128 KiB. A ChunkSource of the caller's does best to cut its chunks
// so too.
int64_t SplitChunkBytes(int64_t chunk_bytes, int64_t total_bytes);

// Hands out the chunks of one or more tensors in order: for each tensor, batch
// entry by batch entry, runs of whole token rows of at most SplitChunkBytes
// wire bytes (one row per chunk where a single row is larger), converted to
// the wire dtype.
class ChunkStream : public ChunkSource {
 public:
  // Requires chunk_bytes >= 1.
  ChunkStream(DType wire_dtype, int64_t chunk_bytes);

  ChunkStream(const ChunkStream&) = delete;
  ChunkStream& operator=(const ChunkStream&) = delete;

  // Queues `tensor` (a [batch, seq, heads, dim] view whose memory must outlive
  // the stream) to be sent as tensor `name` after those added before it.
  void Add(v1::TensorName name, View<const float> tensor);

  bool Next(v1::TensorChunk* chunk) override;
  // Wire bytes of the data of all chunks of all tensors added.
  int64_t total_bytes() const override;
  // Fixes the chunks: no Add after the first call of this or of Next.
  int64_t chunk_count() override;
  void Fill(int64_t index, v1::TensorChunk* chunk) const override;

 private:
  struct Entry {
    v1::TensorName name;
    View<const float> tensor;
  };
  // Where a chunk's rows are: entry, batch entry, first token and count.
  struct Place {
    size_t entry = 0;
    int64_t batch = 0;
    int64_t token = 0;
    int64_t rows = 0;
  };
  // Once: the chunk size in force and every chunk's place.
  void Plan();

  DType wire_dtype_;
  int64_t chunk_bytes_;  // the limit asked for
  std::vector<Entry> entries_;
  bool planned_ = false;
  std::vector<Place> places_;
  size_t next_ = 0;  // the chunk Next gives next
};

// All chunks of `tensor` at once (what a ChunkStream holding only it yields).
std::vector<v1::TensorChunk> SplitTensor(v1::TensorName name,
                                         View<const float> tensor,
                                         DType wire_dtype, int64_t chunk_bytes);

// Checks the OutputChunks of one response: every token row exactly once, with
// data of the right size. It collects them into fp32 O [batch, q_len, q_heads,
// head_dim] and, if asked, LSE [batch, q_heads, q_len], or, for outputs too
// large to hold, hands each checked chunk to the caller instead.
class OutputAssembler {
 public:
  // Called with each checked chunk instead of keeping it.
  using Consumer = std::function<absl::Status(const v1::OutputChunk&)>;

  // `shape` is O's shape (every extent >= 1); O arrives in `dtype`.
  OutputAssembler(Shape shape, bool with_lse, DType dtype = DType::kFloat32);
  // Keeps no rows: passes each checked chunk to `consumer`, whose error ends
  // the call.
  OutputAssembler(Shape shape, bool with_lse, DType dtype, Consumer consumer);

  OutputAssembler(const OutputAssembler&) = delete;
  OutputAssembler& operator=(const OutputAssembler&) = delete;

  // Copies the rows of `chunk` into place (widened to fp32), or passes it to
  // the consumer. INTERNAL, naming the rows, if they fall outside the output,
  // repeat rows already received, or carry data or LSE of the wrong size (or
  // LSE that was not asked for); nothing is copied then.
  absl::Status Add(const v1::OutputChunk& chunk);

  // OK once every row has arrived; DATA_LOSS naming how many rows are missing
  // and the first of them otherwise.
  absl::Status CheckComplete() const;

  // Bytes of output and LSE received so far, and in all.
  int64_t bytes_received() const { return bytes_received_; }
  int64_t total_bytes() const;

  // O, and LSE (empty without with_lse or with a consumer). Complete once
  // CheckComplete() is OK.
  Tensor<float>& output() { return output_; }
  std::vector<float>& lse() { return lse_; }

 private:
  Shape shape_;
  bool with_lse_;
  DType dtype_;
  Consumer consumer_;
  Tensor<float> output_;
  std::vector<float> lse_;
  // One flag per (batch, token): whether that row has arrived.
  std::vector<bool> received_;
  int64_t rows_received_ = 0;
  int64_t bytes_received_ = 0;
};

}  // namespace ringattn

#endif  // RINGATTN_CLIENT_CHUNKING_H_
