#include "server/row_stream.h"

namespace ringattn {

RowStream::RowStream(v1::Worker::Stub& stub, const std::string& key,
                     std::chrono::system_clock::time_point deadline,
                     int64_t max_queued_bytes) {
  context.set_deadline(deadline);
  // Not corked: a stream that gets no rows (fewer chunks than streams) must
  // still reach the worker, and the synchronous WritesDone does not send
  // metadata that is still corked: it would wait for them as long as the
  // call may last, without end for a call that has no deadline.
  context.AddMetadata(kRowsKeyMetadata, key);
  stream = stub.AttachRows(&context);
  writer = WriterOf(stream.get(), max_queued_bytes);
}

bool RowStream::EndRows() { return writer->Flush() && stream->WritesDone(); }

std::vector<std::unique_ptr<RowStream>> OpenRowStreams(
    const std::vector<std::shared_ptr<v1::Worker::Stub>>& stubs,
    const std::string& key, std::chrono::system_clock::time_point deadline,
    int64_t max_queued_bytes) {
  std::vector<std::unique_ptr<RowStream>> streams;
  for (const std::shared_ptr<v1::Worker::Stub>& stub : stubs) {
    streams.push_back(
        std::make_unique<RowStream>(*stub, key, deadline, max_queued_bytes));
  }
  return streams;
}

}  // namespace ringattn
