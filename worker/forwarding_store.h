#ifndef RINGATTN_WORKER_FORWARDING_STORE_H_
#define RINGATTN_WORKER_FORWARDING_STORE_H_

// ForwardingStore: a rendezvous store that passes every call to another
// store, for wrappers that change only some of them (how a wait ends, what a
// failed wait leaves behind). Thread-compatible as the inner store is.

#include <chrono>
#include <string>
#include <vector>

#include "gloo/rendezvous/store.h"

namespace ringattn {

class ForwardingStore : public gloo::rendezvous::Store {
 public:
  // `inner` must outlive this.
  explicit ForwardingStore(gloo::rendezvous::Store& inner) : inner_(inner) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
  }
  std::vector<char> get(const std::string& key) override {
    return inner_.get(key);
  }
  // With the store's default timeout, through the two-argument wait, so that
  // a wrapper overrides that one alone.
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, kDefaultTimeout);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }

 protected:
  gloo::rendezvous::Store& inner() { return inner_; }

 private:
  gloo::rendezvous::Store& inner_;
};

}  // namespace ringattn

#endif  // RINGATTN_WORKER_FORWARDING_STORE_H_
