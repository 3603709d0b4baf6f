#include "worker/grpc_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"
#include "grpcpp/client_context.h"

namespace ringattn {
namespace {

std::string Describe(const grpc::Status& status) {
  return absl::StrCat("status ", static_cast<int>(status.error_code()), " (",
                      status.error_message(), ")");
}

}  // namespace

GrpcStore::GrpcStore(std::shared_ptr<v1::Coordination::StubInterface> stub,
                     absl::Duration timeout)
    : stub_(std::move(stub)), timeout_(timeout) {}

void GrpcStore::set(const std::string& key, const std::vector<char>& data) {
  v1::StoreSetRequest request;
  request.set_key(key);
  request.set_value(data.data(), data.size());
  v1::StoreSetResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  const grpc::Status status = stub_->StoreSet(&context, request, &response);
  if (!status.ok()) {
    throw gloo::IoException(absl::StrCat("rendezvous store: setting key '", key,
                                         "' failed: ", Describe(status)));
  }
}

std::vector<char> GrpcStore::get(const std::string& key) {
  return std::move(Fetch({key}, timeout_).front());
}

void GrpcStore::wait(const std::vector<std::string>& keys) {
  Fetch(keys, timeout_);
}

void GrpcStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  Fetch(keys,
        timeout == gloo::kNoTimeout ? timeout_ : absl::FromChrono(timeout));
}

std::vector<std::vector<char>> GrpcStore::Fetch(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  v1::StoreGetRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  v1::StoreGetResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  const grpc::Status status = stub_->StoreGet(&context, request, &response);
  const std::string names = absl::StrCat("'", absl::StrJoin(keys, "', '"), "'");
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    throw gloo::IoException(absl::StrCat("rendezvous store: wait timeout for ",
                                         names, " after ",
                                         absl::FormatDuration(timeout)));
  }
  if (!status.ok()) {
    throw gloo::IoException(absl::StrCat("rendezvous store: getting ", names,
                                         " failed: ", Describe(status)));
  }
  if (response.values_size() != static_cast<int>(keys.size())) {
    throw gloo::IoException(absl::StrCat("rendezvous store: asked for ",
                                         keys.size(), " keys but got ",
                                         response.values_size(), " values"));
  }
  std::vector<std::vector<char>> values;
  values.reserve(keys.size());
  for (const std::string& value : response.values()) {
    values.emplace_back(value.begin(), value.end());
  }
  return values;
}

}  // namespace ringattn
