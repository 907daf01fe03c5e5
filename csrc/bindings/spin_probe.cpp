// fun_asr._spin: how long one spin-wait iteration takes on this CPU, measured before libgomp loads.
//
// ggml's CPU backend waits at an OpenMP barrier after every graph node; libgomp spins GOMP_SPINCOUNT
// times (each a load and a `pause`) before it sleeps in the kernel. The spin must outlast the
// ordinary wait for a peer thread (a few microseconds on a quiet machine), yet end soon when the
// peer has lost its core to another process: there every spinning microsecond is time that peer
// cannot run. A `pause` costs ~3 ns on older Intel cores, ~30 ns on AMD Zen, ~45 ns on Skylake and
// later, so a fixed count means a tenfold different wait. This module is linked without ggml or
// libgomp, so fun_asr can import it, turn a wait in microseconds into a count, and set
// GOMP_SPINCOUNT before _core (and with it libgomp, which reads the variable once) loads.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <chrono>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FUN_ASR_RELAX() _mm_pause()
#elif defined(__aarch64__) && (defined(__GNUC__) || defined(__clang__))
#define FUN_ASR_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define FUN_ASR_RELAX() ((void)0)
#endif

namespace {

std::atomic<int> g_flag{0};

// Nanoseconds per iteration of libgomp's spin loop (an atomic load, then a pause): the best of a
// few rounds of `iters` iterations (the least disturbed).
double spin_ns(int iters, int rounds) {
    double best = 1e300;
    for (int r = 0; r < rounds; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters; ++i) {
            if (g_flag.load(std::memory_order_relaxed) != 0) break;
            FUN_ASR_RELAX();
        }
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        best = std::min(best, ns / iters);
    }
    return best;
}

}  // namespace

PYBIND11_MODULE(_spin, m) {
    m.doc() = "Spin-wait timing of this CPU (no ggml, no OpenMP): sets fun_asr's GOMP_SPINCOUNT.";
    m.def("spin_ns", &spin_ns, pybind11::arg("iters") = 5000, pybind11::arg("rounds") = 3,
          "Nanoseconds per spin-wait iteration (atomic load + pause), best of `rounds` runs of `iters`.");
}
