// threads = 0 ("auto"): how many of the machine's cores a graph gets, chosen by measurement.
//
// On a quiet machine every core helps. When another process holds a core, a graph's threads wait
// for the one that lost its core at each of the ~700 barriers of a decode step: measured on 2 cores
// beside one busy process, a 2-thread decode step took 34 ms where 1 thread took 25 ms (quiet: 19
// and 25 ms). So the model times its decode steps (frequent and alike) with each candidate count
// now and then, keeps the fastest, and gives encoder passes and prefills the same count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace fun_asr {

class ThreadChooser {
public:
    static constexpr int64_t kProbeEvery = 16;  // every 16th step tries a neighbour of the best count
    static constexpr double kSwitchMargin = 0.85;  // another count must be 15 % faster to take over

    // max_threads: the cores there are; candidates max, max-1, max/2, max/4, ..., 1.
    explicit ThreadChooser(int max_threads = 1);

    // Threads for the next decode step (steps count up; every kProbeEvery-th one is a probe).
    int step_threads();
    // The step just computed took `ms` with `threads` threads for `columns` sequences (estimates are
    // kept per column count, so a server whose batch size changes compares like with like).
    void record_step(int threads, int64_t columns, double ms);
    // Threads for an encoder pass or a prefill: the best decode count (all cores until measured).
    int bulk_threads() const { return candidates_[best_]; }

    const std::vector<int> & candidates() const { return candidates_; }
    // ms per step per candidate at the last column count (negative: not measured).
    std::vector<double> estimates() const;
    int64_t probes() const { return probes_; }

private:
    std::vector<int> candidates_;
    std::map<int64_t, std::vector<double>> ema_;  // column count -> ms per step per candidate
    size_t best_ = 0;
    int64_t steps_ = 0, probes_ = 0, columns_ = -1;
    bool probe_up_ = false;  // alternate the probed neighbour (fewer / more threads)
};

}  // namespace fun_asr
