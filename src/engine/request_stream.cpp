#include "helios/engine.h"

#include <iterator>

namespace helios {

void RequestStream::push(GenerationUpdate update) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    updates_.push_back(std::move(update));
  }
  cv_.notify_one();
}

std::optional<GenerationUpdate> RequestStream::pop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return !updates_.empty(); })) return std::nullopt;
  // Merge everything that is waiting into one update: a slow reader gets fewer, larger messages.
  // A pause ends a merge as the end does: the reader must see each intercept.
  GenerationUpdate merged = std::move(updates_.front());
  updates_.pop_front();
  while (!updates_.empty() && merged.finish == FinishReason::kNone && !merged.intercept) {
    GenerationUpdate next = std::move(updates_.front());
    updates_.pop_front();
    next.tokens.insert(next.tokens.begin(), std::make_move_iterator(merged.tokens.begin()),
                       std::make_move_iterator(merged.tokens.end()));
    merged = std::move(next);
  }
  return merged;
}

}  // namespace helios
