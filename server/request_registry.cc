#include "server/request_registry.h"

#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ridgeserve {

absl::Status RequestRegistry::Admit(std::string* request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (draining_) return absl::UnavailableError("server is shutting down");
  if (request_id->empty()) {
    // A random prefix per process keeps generated ids apart from other servers' behind the
    // same router; the counter keeps them apart within this one.
    static const uint64_t prefix = std::random_device{}();
    do {
      *request_id = absl::StrFormat("rs-%08x-%d", prefix & 0xffffffffu, next_name_++);
    } while (entries_.contains(*request_id));
  } else if (entries_.contains(*request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id \"", *request_id, "\" is already in use by a live request"));
  }
  entries_.emplace(*request_id, Entry{});
  return absl::OkStatus();
}

bool RequestRegistry::SetEngineId(const std::string& request_id, uint64_t engine_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(request_id);
  if (it == entries_.end()) return false;
  it->second.engine_id = engine_id;
  return it->second.abort_requested;
}

absl::StatusOr<std::optional<uint64_t>> RequestRegistry::RequestAbort(
    const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(request_id);
  if (it == entries_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no live request with request_id \"", request_id, "\""));
  }
  it->second.abort_requested = true;
  return it->second.engine_id;
}

void RequestRegistry::Remove(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(request_id);
  if (entries_.empty()) empty_cv_.notify_all();
}

void RequestRegistry::StartDraining() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool RequestRegistry::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

std::vector<uint64_t> RequestRegistry::AbortAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint64_t> ids;
  for (auto& [name, entry] : entries_) {
    entry.abort_requested = true;
    if (entry.engine_id) ids.push_back(*entry.engine_id);
  }
  return ids;
}

bool RequestRegistry::WaitUntilEmpty(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return empty_cv_.wait_until(lock, absl::ToChronoTime(deadline), [&] { return entries_.empty(); });
}

int RequestRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(entries_.size());
}

}  // namespace ridgeserve
