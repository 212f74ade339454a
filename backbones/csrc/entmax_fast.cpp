// Exact entmax-1.5 and sparsemax over the last axis of a (rows, n) array, CPU, no sort.
//
// Built by backbones/entmax_fast.py at first use (g++ -O3 -march=native -fopenmp) and called through
// ctypes with raw pointers, so it needs no torch headers (build takes ~1 s instead of ~1 min) and
// shares torch's libgomp (same soname) instead of starting a second thread pool.
//
// Forward, per row (z = (x - max x)/2 for entmax-1.5, z = x - max x for sparsemax; tau* lies in [-1, 0]):
//   tau is found by Newton steps from below, starting at tau = -1, on a convex decreasing function
//   of tau (entmax-1.5: h = ||(z - tau)_+||_2 - 1, sparsemax: f = sum (z - tau)_+ - 1); Newton from
//   the left never overshoots, so S = {z > tau} always contains the true support. Each sweep also
//   computes the closed-form root on S (as entmax's sort-based code does for a prefix) and stops when
//   that root is consistent with S (every member above it, every non-member at or below it): then it
//   is the exact threshold. Rows that do not settle in MAX_SWEEPS fall back to the sort-based formula.
// Backward saves only Y: entmax-1.5 dX = g (dY - sum(g dY)/sum(g)) with g = sqrt(Y);
//   sparsemax dX = s (dY - sum(s dY)/sum(s)) with s = [Y > 0].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace {

constexpr int MAX_SWEEPS = 64;

// Sort-based exact threshold (the formula of entmax's _entmax_threshold_and_support / sparsemax),
// used only for rows the sweep did not settle.
template <typename T>
T threshold_sorted(const T* z, int64_t n, bool entmax15) {
  std::vector<T> s;
  s.reserve(n);
  for (int64_t i = 0; i < n; ++i)
    if (z[i] > -std::numeric_limits<T>::infinity()) s.push_back(z[i]);
  std::sort(s.begin(), s.end(), std::greater<T>());
  T s1 = 0, s2 = 0, tau = 0;
  for (size_t k = 1; k <= s.size(); ++k) {
    s1 += s[k - 1];
    s2 += s[k - 1] * s[k - 1];
    T t;
    if (entmax15) {
      T mean = s1 / k, ss = s2 - s1 * mean, delta = (1 - ss) / k;
      t = mean - std::sqrt(std::max(delta, T(0)));
    } else {
      t = (s1 - 1) / k;
    }
    if (t <= s[k - 1]) tau = t;  // support size = last k whose candidate is below the k-th value
    else break;
  }
  return tau;
}

template <typename T, bool ENTMAX15>
void forward_row(const T* x, T* y, int64_t n) {
  const T inf = std::numeric_limits<T>::infinity();
  T m = -inf;
  int nans = 0;
#pragma omp simd reduction(max : m) reduction(+ : nans)
  for (int64_t i = 0; i < n; ++i) {
    m = std::max(m, x[i]);
    nans += x[i] != x[i];
  }
  if (nans || !(m > -inf) || !(m < inf)) {  // all masked, or +inf/NaN present: undefined, like softmax
    for (int64_t i = 0; i < n; ++i) y[i] = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  const T scale = ENTMAX15 ? T(0.5) : T(1);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * scale;  // z, kept in the output buffer

  T t = -1;  // lower bound: the max alone already gives mass (0 - (-1))^p = 1
  bool done = false;
  for (int sweep = 0; sweep < MAX_SWEEPS && !done; ++sweep) {
    // statistics of d = z - t on S = {d > 0}, in shifted coordinates for conditioning
    T k = 0, s1 = 0, s2 = 0, mn = inf, mx_out = -inf;
#pragma omp simd reduction(+ : k, s1, s2) reduction(min : mn) reduction(max : mx_out)
    for (int64_t i = 0; i < n; ++i) {
      T d = y[i] - t;
      bool in = d > 0;
      k += in ? T(1) : T(0);
      s1 += in ? d : T(0);
      if (ENTMAX15) s2 += in ? d * d : T(0);
      mn = std::min(mn, in ? d : inf);
      mx_out = std::max(mx_out, in ? -inf : d);
    }
    T u, step;
    if (ENTMAX15) {
      T mean = s1 / k, ss = s2 - s1 * mean, delta = (1 - ss) / k;
      u = mean - std::sqrt(std::max(delta, T(0)));
      step = (s2 - std::sqrt(s2)) / s1;  // Newton on ||d_+|| - 1
    } else {
      u = (s1 - 1) / k;
      step = u;  // Newton on a piecewise-linear function = Michelot's projection step
    }
    if (u <= mn && mx_out <= u) {
      t += u;
      done = true;
    } else if (step > 0 && std::isfinite(step)) {
      t += step;
    } else {
      break;  // no progress left in floating point
    }
  }
  if (!done) t = threshold_sorted(y, n, ENTMAX15);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    T d = std::max(y[i] - t, T(0));
    y[i] = ENTMAX15 ? d * d : d;
  }
}

template <typename T, bool ENTMAX15>
void backward_row(const T* y, const T* dy, T* dx, int64_t n) {
  T sg = 0, sgd = 0;
#pragma omp simd reduction(+ : sg, sgd)
  for (int64_t i = 0; i < n; ++i) {
    T g = ENTMAX15 ? std::sqrt(y[i]) : (y[i] > 0 ? T(1) : T(0));
    sg += g;
    sgd += g * dy[i];
  }
  const T q = sgd / sg;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    T g = ENTMAX15 ? std::sqrt(y[i]) : (y[i] > 0 ? T(1) : T(0));
    dx[i] = g * (dy[i] - q);
  }
}

// Rows are independent; a static split keeps each thread on contiguous memory.
template <typename F>
void for_rows(int64_t rows, int64_t n, int threads, F f) {
  if (threads < 1 || rows * n < 32768) threads = 1;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < rows; ++r) f(r);
}

}  // namespace

#define TM_DEFINE(T, SUF)                                                                          \
  extern "C" void tm_entmax15_fwd_##SUF(const T* x, T* y, int64_t rows, int64_t n, int threads) { \
    for_rows(rows, n, threads, [&](int64_t r) { forward_row<T, true>(x + r * n, y + r * n, n); }); \
  }                                                                                                \
  extern "C" void tm_sparsemax_fwd_##SUF(const T* x, T* y, int64_t rows, int64_t n, int threads) { \
    for_rows(rows, n, threads, [&](int64_t r) { forward_row<T, false>(x + r * n, y + r * n, n); }); \
  }                                                                                                \
  extern "C" void tm_entmax15_bwd_##SUF(const T* y, const T* dy, T* dx, int64_t rows, int64_t n,  \
                                        int threads) {                                             \
    for_rows(rows, n, threads,                                                                     \
             [&](int64_t r) { backward_row<T, true>(y + r * n, dy + r * n, dx + r * n, n); });     \
  }                                                                                                \
  extern "C" void tm_sparsemax_bwd_##SUF(const T* y, const T* dy, T* dx, int64_t rows, int64_t n, \
                                         int threads) {                                            \
    for_rows(rows, n, threads,                                                                     \
             [&](int64_t r) { backward_row<T, false>(y + r * n, dy + r * n, dx + r * n, n); });    \
  }

TM_DEFINE(float, f32)
TM_DEFINE(double, f64)

// Lets Python check that the library it loaded matches the source it hashed.
extern "C" int tm_abi_version() { return 1; }
