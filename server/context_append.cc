#include "server/context_append.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "proto/spec_conversion.h"
#include "ringattn/v1/worker.grpc.pb.h"
#include "server/shared_upload.h"

namespace ringattn {
namespace {

// Appends of at most this many bytes of K and V reach each worker as one
// message (the header carrying the rows), written by EndWrites: a decode
// step's new row then costs its worker one write instead of four.
constexpr int64_t kMostWholeAppendBytes = int64_t{1} << 20;

}  // namespace

// One worker's StoreContext stream.
struct ContextAppend::Link {
  Cluster::Member member;
  grpc::ClientContext context;
  v1::StoreContextResponse response;
  // None with AppendDelivery::kWithQuery.
  std::unique_ptr<grpc::ClientWriter<v1::StoreContextRequest>> writer;
  // A large part: its rows go round these instead of the StoreContext
  // stream.
  std::vector<std::unique_ptr<RowStream>> row_streams;
  size_t next_row_stream = 0;
  // Why a row stream failed in EndWrites; Finish reports it.
  absl::Status failure;
  // A small append: the header, collecting the worker's rows until EndWrites
  // sends it (or TakeRowsFor takes them).
  std::optional<v1::StoreContextRequest> whole;
};

ContextAppend::ContextAppend(ResidentContext before, int64_t count,
                             DType wire_dtype, AppendDelivery delivery)
    : before_(std::move(before)),
      count_(count),
      dtype_(wire_dtype),
      delivery_(delivery) {}

ContextAppend::~ContextAppend() {
  if (finished_) return;
  for (const auto& link : links_) {
    if (link->writer != nullptr) link->context.TryCancel();
    for (const auto& row : link->row_streams) row->context.TryCancel();
  }
}

int ContextAppend::row_streams() const {
  int streams = 0;
  for (const auto& link : links_) {
    streams += static_cast<int>(link->row_streams.size());
  }
  return streams;
}

absl::Status ContextAppend::RowStreamError(Link& link, RowStream& row) {
  grpc::Status status = row.stream->Finish();
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    status = link.writer->Finish();
  }
  link.context.TryCancel();
  for (const auto& other : link.row_streams) other->context.TryCancel();
  return WorkerError(link, status);
}

absl::Status ContextAppend::EndRowStreams(Link& link) {
  for (const auto& row : link.row_streams) {
    if (!row->EndRows()) return RowStreamError(link, *row);
  }
  for (const auto& row : link.row_streams) {
    v1::ExecuteResponse stored;
    if (!row->stream->Read(&stored)) return RowStreamError(link, *row);
  }
  return absl::OkStatus();
}

absl::Status ContextAppend::WorkerError(const Link& link,
                                        const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat(
        "worker ", link.member.rank, " (", link.member.address,
        ") failed while storing context rows: ", status.error_message()));
  }
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat("worker ", link.member.rank, ": ", status.error_message()));
}

absl::StatusOr<std::unique_ptr<ContextAppend>> ContextAppend::Start(
    const std::vector<Cluster::Member>& members, const ResidentContext& before,
    bool create, int64_t count, DType wire_dtype,
    std::chrono::system_clock::time_point deadline,
    int64_t row_streams_min_bytes, AppendDelivery delivery) {
  std::unique_ptr<ContextAppend> append(
      new ContextAppend(before, count, wire_dtype, delivery));
  std::vector<int64_t> held;
  int64_t last = -1;  // the worker holding the context's last position
  for (const std::vector<Range>& chunks : before.chunks) {
    int64_t rows = 0;
    for (const Range& chunk : chunks) {
      rows += chunk.size();
      if (chunk.end == before.length && !chunk.empty()) {
        last = static_cast<int64_t>(held.size());
      }
    }
    held.push_back(rows);
  }
  append->runs_ =
      BalancedRuns(held, before.length, count, last, kAppendSlackPositions);
  // The layout the context will have.
  append->after_ = before;
  append->after_.length += count;
  for (size_t rank = 0; rank < append->runs_.size(); ++rank) {
    const Range run = append->runs_[rank];
    std::vector<Range>& chunks = append->after_.chunks[rank];
    if (run.empty()) continue;
    if (!chunks.empty() && chunks.back().end == run.begin) {
      chunks.back().end = run.end;
    } else {
      chunks.push_back(run);
    }
  }
  for (int64_t b = 0; b < 2 * before.batch; ++b) {
    append->coverage_.emplace_back(count);
  }
  const bool with_query = delivery == AppendDelivery::kWithQuery;
  const int64_t row_bytes = 2 * before.batch * before.kv_heads *
                            before.head_dim * DTypeSize(wire_dtype);
  const bool whole = with_query || count * row_bytes <= kMostWholeAppendBytes;
  for (const Cluster::Member& member : members) {
    // A worker that gets no new rows of an existing context has nothing to
    // store (a decode step's row goes to one worker).
    if (!create && append->runs_[member.rank].empty()) continue;
    auto link = std::make_unique<Link>();
    link->member = member;
    if (!with_query) {
      link->context.set_deadline(deadline);
      link->context.set_initial_metadata_corked(true);  // sent with the header
      link->writer = member.stub->StoreContext(&link->context, &link->response);
    }
    v1::StoreContextRequest request;
    v1::StoreContextHeader* h = request.mutable_header();
    h->set_name(before.name);
    h->set_create(create);
    h->set_batch(before.batch);
    h->set_kv_heads(before.kv_heads);
    h->set_head_dim(before.head_dim);
    h->set_wire_dtype(DTypeToProto(wire_dtype));
    h->set_first_position(append->runs_[member.rank].begin);
    h->set_count(append->runs_[member.rank].size());
    h->set_undone_appends(before.undone_appends);
    const int64_t worker_bytes = append->runs_[member.rank].size() * row_bytes;
    if (!whole && !member.row_stubs.empty() &&
        worker_bytes >= row_streams_min_bytes) {
      const std::string key =
          absl::StrCat("context/", NewUploadToken(), "/", member.rank);
      h->set_rows_key(key);
      link->row_streams =
          OpenRowStreams(member.row_stubs, key, deadline,
                         kMaxQueuedBytesPerWorker /
                             static_cast<int64_t>(member.row_stubs.size()));
    }
    if (whole) {
      link->whole = std::move(request);
      append->links_.push_back(std::move(link));
      continue;
    }
    const bool sent = link->writer->Write(request);
    append->links_.push_back(std::move(link));
    if (!sent) {
      const Link& failed = *append->links_.back();
      return append->WorkerError(failed, failed.writer->Finish());
    }
  }
  return append;
}

absl::Status ContextAppend::Route(v1::TensorChunk& chunk, int64_t index) {
  if (chunk.tensor() != v1::K && chunk.tensor() != v1::V) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index,
        ": a context holds K and V; field 'tensor' must be K or V"));
  }
  const char* name = chunk.tensor() == v1::K ? "K" : "V";
  if (chunk.batch() < 0 || chunk.batch() >= before_.batch) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, ": tensor ", name, " batch ",
                     chunk.batch(), " is outside [0, ", before_.batch, ")"));
  }
  const int64_t begin = chunk.token_offset();
  const int64_t count = chunk.token_count();
  // begin + count could overflow; count_ - count cannot.
  if (count < 1 || begin < 0 || begin > count_ - count) {
    int64_t end;
    const std::string end_text = __builtin_add_overflow(begin, count, &end)
                                     ? absl::StrCat(begin, " + ", count)
                                     : absl::StrCat(end);
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, ": tensor ", name, " tokens [", begin, ", ", end_text,
        ") are not inside [0, ", count_, ") (the new tokens)"));
  }
  const int64_t row_bytes =
      before_.kv_heads * before_.head_dim * DTypeSize(dtype_);
  if (static_cast<int64_t>(chunk.data().size()) != count * row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk ", index, ": tensor ", name, " carries ", chunk.data().size(),
        " bytes but ", count, " tokens x ", before_.kv_heads, " heads x ",
        before_.head_dim, " dims of ", DTypeName(dtype_), " need ",
        count * row_bytes));
  }
  RowCoverage& coverage =
      coverage_[(chunk.tensor() == v1::K ? 0 : before_.batch) + chunk.batch()];
  if (std::optional<Range> twice = coverage.Mark(begin, begin + count)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, ": tensor ", name, " batch ",
                     chunk.batch(), " tokens [", twice->begin, ", ", twice->end,
                     ") were already sent (duplicate or overlapping chunk)"));
  }
  const Range positions{before_.length + begin, before_.length + begin + count};
  for (const auto& link : links_) {
    const Range part = positions.Intersect(runs_[link->member.rank]);
    if (part.empty()) continue;
    v1::StoreContextRequest request;
    v1::ExecuteRequest attached;
    v1::ShardRows* rows = link->whole.has_value()
                              ? link->whole->mutable_header()->add_rows()
                          : link->row_streams.empty() ? request.mutable_rows()
                                                      : attached.mutable_rows();
    rows->set_tensor(chunk.tensor());
    rows->set_batch(chunk.batch());
    rows->set_first_position(part.begin);
    rows->set_count(part.size());
    if (part.size() == count) {
      rows->set_data(std::move(*chunk.mutable_data()));
    } else {
      rows->set_data(chunk.data().substr(
          (part.begin - positions.begin) * row_bytes, part.size() * row_bytes));
    }
    if (link->whole.has_value()) continue;
    if (!link->row_streams.empty()) {
      RowStream& row = *link->row_streams[link->next_row_stream++ %
                                          link->row_streams.size()];
      if (!row.writer->Push(std::move(attached))) {
        return RowStreamError(*link, row);
      }
    } else if (!link->writer->Write(request)) {
      return WorkerError(*link, link->writer->Finish());
    }
  }
  return absl::OkStatus();
}

absl::Status ContextAppend::CheckComplete() const {
  for (size_t i = 0; i < coverage_.size(); ++i) {
    if (std::optional<Range> missing = coverage_[i].FirstMissing()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", i < static_cast<size_t>(before_.batch) ? "K" : "V",
          " batch ", i % before_.batch, " is missing new tokens [",
          missing->begin, ", ", missing->end,
          "); send every token row exactly once"));
    }
  }
  return absl::OkStatus();
}

void ContextAppend::EndWrites() {
  if (writes_ended_) return;
  // A failed write shows in Finish, as the stream's status.
  for (const auto& link : links_) {
    if (link->writer == nullptr) continue;
    // The worker stores its part once this stream ends, so every row must
    // be in by then.
    link->failure = EndRowStreams(*link);
    if (!link->failure.ok()) continue;
    if (link->whole.has_value()) {
      link->writer->Write(*link->whole,
                          grpc::WriteOptions().set_last_message());
      link->whole.reset();
    } else {
      link->writer->WritesDone();
    }
  }
  writes_ended_ = true;
}

absl::Status ContextAppend::Finish() {
  EndWrites();
  absl::Status first = absl::OkStatus();
  for (const auto& link : links_) {
    if (!link->failure.ok()) {
      if (first.ok()) first = link->failure;
      continue;
    }
    const grpc::Status status = link->writer->Finish();
    if (!status.ok() && first.ok()) first = WorkerError(*link, status);
    // They end as the StoreContext stream did.
    for (const auto& row : link->row_streams) {
      const grpc::Status ended = row->stream->Finish();
      if (!ended.ok() && first.ok()) first = WorkerError(*link, ended);
    }
  }
  finished_ = true;
  if (!first.ok()) return first;
  std::vector<int64_t> held;
  std::vector<v1::DType> dtypes;
  for (const auto& link : links_) {
    held.push_back(link->response.bytes());
    dtypes.push_back(link->response.dtype());
  }
  CountHoldings(held, dtypes);
  return absl::OkStatus();
}

std::optional<v1::StoreContextHeader> ContextAppend::TakeRowsFor(int rank) {
  for (const auto& link : links_) {
    if (link->member.rank != rank || !link->whole.has_value()) continue;
    std::optional<v1::StoreContextHeader> rows(
        std::move(*link->whole->mutable_header()));
    link->whole.reset();
    return rows;
  }
  return std::nullopt;
}

absl::Status ContextAppend::FinishWithQuery(
    const std::vector<v1::ExecuteDone>& done) {
  finished_ = true;
  std::vector<int64_t> held;
  std::vector<v1::DType> dtypes;
  for (const auto& link : links_) {
    const int rank = link->member.rank;
    if (rank >= static_cast<int>(done.size()) ||
        done[rank].context_bytes() <= 0) {
      return absl::InternalError(
          absl::StrCat("worker ", rank, " (", link->member.address,
                       ") did not report storing the rows the query appended"));
    }
    held.push_back(done[rank].context_bytes());
    dtypes.push_back(done[rank].context_dtype());
  }
  CountHoldings(held, dtypes);
  return absl::OkStatus();
}

void ContextAppend::CountHoldings(const std::vector<int64_t>& held,
                                  const std::vector<v1::DType>& dtypes) {
  after_.worker_bytes.resize(after_.chunks.size());
  after_.worker_dtypes.resize(after_.chunks.size(), v1::DTYPE_UNSPECIFIED);
  for (size_t i = 0; i < links_.size(); ++i) {
    after_.worker_bytes[links_[i]->member.rank] = held[i];
    after_.worker_dtypes[links_[i]->member.rank] = dtypes[i];
  }
  after_.bytes = 0;
  for (int64_t bytes : after_.worker_bytes) after_.bytes += bytes;
}

}  // namespace ringattn
