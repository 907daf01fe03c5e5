#include "runtime/thread_chooser.h"

#include <algorithm>
#include <stdexcept>

namespace fun_asr {

ThreadChooser::ThreadChooser(int max_threads) {
    if (max_threads < 1) throw std::invalid_argument("ThreadChooser: max_threads must be >= 1");
    candidates_.push_back(max_threads);
    if (max_threads > 2) candidates_.push_back(max_threads - 1);
    for (int n = max_threads / 2; n >= 1; n /= 2) {
        if (n < candidates_.back()) candidates_.push_back(n);
    }
    if (candidates_.back() != 1) candidates_.push_back(1);
}

std::vector<double> ThreadChooser::estimates() const {
    const auto it = ema_.find(columns_);
    return it == ema_.end() ? std::vector<double>(candidates_.size(), -1.0) : it->second;
}

int ThreadChooser::step_threads() {
    ++steps_;
    if (candidates_.size() == 1 || steps_ % kProbeEvery != 0) return candidates_[best_];
    // A neighbour of the best: fewer threads, then more, in turn (only one exists at either end).
    const bool can_down = best_ + 1 < candidates_.size(), can_up = best_ > 0;
    probe_up_ = !probe_up_;
    const bool up = can_up && (probe_up_ || !can_down);
    ++probes_;
    return candidates_[up ? best_ - 1 : best_ + 1];
}

void ThreadChooser::record_step(int threads, int64_t columns, double ms) {
    const auto it = std::find(candidates_.begin(), candidates_.end(), threads);
    if (it == candidates_.end() || !(ms >= 0.0) || columns < 1) return;
    columns_ = columns;
    if (ema_.size() >= 64 && ema_.count(columns) == 0) ema_.clear();  // bounded, whatever the batch sizes
    std::vector<double> & ema = ema_.try_emplace(columns, candidates_.size(), -1.0).first->second;
    const size_t i = static_cast<size_t>(it - candidates_.begin());
    // The best count's steps average (EMA); a probe replaces its count's estimate: it is the only fresh
    // sample of that count, and the machine may have changed since the last one.
    ema[i] = ema[i] < 0.0 || i != best_ ? ms : 0.7 * ema[i] + 0.3 * ms;
    // The best is the fastest measured count; another takes over only when clearly faster than the
    // best's own estimate at this column count (none yet: nothing to compare, keep it).
    if (ema[best_] < 0.0) return;
    size_t fastest = best_;
    for (size_t j = 0; j < ema.size(); ++j) {
        if (ema[j] >= 0.0 && ema[j] < ema[fastest]) fastest = j;
    }
    if (fastest != best_ && ema[fastest] < kSwitchMargin * ema[best_]) best_ = fastest;
}

}  // namespace fun_asr
