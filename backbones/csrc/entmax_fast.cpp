// Exact entmax-1.5 and sparsemax over the last axis of a (rows, n) array, CPU, no sort.
//
// Built by backbones/entmax_fast.py at first use (g++ -O3 -march=native -fopenmp -fno-math-errno
// -fno-trapping-math) and called through ctypes with raw pointers, so it needs no torch headers (build
// takes ~2 s instead of ~1 min) and shares torch's libgomp (same soname) instead of a second thread pool.
//
// Forward, per row (z = (x - max x)/2 for entmax-1.5, z = x - max x for sparsemax; tau* lies in [-1, 0]):
//   tau is found by Newton steps from below, starting at tau = -1, on a convex decreasing function
//   of tau (entmax-1.5: h = ||(z - tau)_+||_2 - 1, sparsemax: f = sum (z - tau)_+ - 1); Newton from
//   the left never overshoots, so S = {z > tau} always contains the true support. Each sweep also
//   computes the closed-form root on S (as entmax's sort-based code does for a prefix) and stops when
//   that root is consistent with S (every member above it, every non-member at or below it): then it
//   is the exact threshold. Rows that do not settle in 64 sweeps fall back to the sort-based formula.
//   Each row starts from the previous row's tau (see forward_row), which saves about a sweep.
// Backward saves only Y: entmax-1.5 dX = g (dY - sum(g dY)/sum(g)) with g = sqrt(Y);
//   sparsemax dX = s (dY - sum(s dY)/sum(s)) with s = [Y > 0].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace {

int g_max_sweeps = 64;  // settable only to test the sort fallback

// Sort-based exact threshold (the formula of entmax's _entmax_threshold_and_support / sparsemax),
// used only for rows the sweep did not settle.
template <typename T>
T threshold_sorted(const T* x, int64_t n, T m, T scale, bool entmax15) {
  std::vector<T> s;  // z = (x - m) * scale of the finite entries
  s.reserve(n);
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > -std::numeric_limits<T>::infinity()) s.push_back((x[i] - m) * scale);
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

// Output of a row given its max m and threshold t (z space): y = ((x - m) s - t)_+^p, s = 1/2 (entmax-1.5)
// or 1 (sparsemax), as entmax computes it (x - m first: exact at the max, precision independent of m).
// One function for the forward's last pass and apply_row (the fused attention backward recomputes Y
// from the saved (m, t) instead of keeping it): the same bits.
template <typename T, bool ENTMAX15>
inline void write_output(const T* x, T* y, int64_t n, T m, T t) {
  const T s = ENTMAX15 ? T(0.5) : T(1);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    T d = std::max((x[i] - m) * s - t, T(0));
    y[i] = ENTMAX15 ? d * d : d;
  }
}

// y may alias x (in place). mt, when given, receives (m, t). t_warm: the previous row's threshold
// (neighbouring queries have similar rows), -1 for a fresh start.
template <typename T, bool ENTMAX15>
void forward_row(const T* x, T* y, int64_t n, T* mt, T& t_warm) {
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
    if (mt) mt[0] = mt[1] = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  const T s = ENTMAX15 ? T(0.5) : T(1);
  // Start: the previous row's tau when it lies in (-1, 0), else -1 (a lower bound: the max alone gives
  // mass 1). A start above the root is fine: one Newton step from anywhere on a convex decreasing function
  // lands at or below the root, and from there the steps rise monotonically.
  T t = (t_warm > -1 && t_warm < 0) ? t_warm : T(-1);
  bool done = false;
  for (int sweep = 0; sweep < g_max_sweeps && !done; ++sweep) {
    // statistics of d = z - t (z = (x - m) s) on S = {d > 0}, in shifted coordinates for conditioning
    T k = 0, s1 = 0, s2 = 0, mn = inf, mx_out = -inf;
#pragma omp simd reduction(+ : k, s1, s2) reduction(min : mn) reduction(max : mx_out)
    for (int64_t i = 0; i < n; ++i) {
      T d = (x[i] - m) * s - t;
      T dp = std::max(d, T(0));
      bool in = d > 0;
      k += in ? T(1) : T(0);
      s1 += dp;
      if (ENTMAX15) s2 += dp * dp;
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
    if (u <= mn && mx_out <= u) {  // closed form consistent with S: the exact root
      t += u;
      done = true;
    } else if (std::isfinite(step) && (step > 0 || sweep == 0)) {
      t = std::max(t + step, T(-1));
    } else {
      break;  // no progress left in floating point
    }
  }
  if (!done) t = threshold_sorted(x, n, m, s, ENTMAX15);
  t_warm = t;
  if (mt) {
    mt[0] = m;
    mt[1] = t;
  }
  write_output<T, ENTMAX15>(x, y, n, m, t);
}

template <typename T, bool ENTMAX15>
void apply_row(const T* x, const T* mt, T* y, int64_t n) {
  if (mt[0] != mt[0]) {
    for (int64_t i = 0; i < n; ++i) y[i] = std::numeric_limits<T>::quiet_NaN();
    return;
  }
  write_output<T, ENTMAX15>(x, y, n, mt[0], mt[1]);
}

// dx may alias dy (in place): each dy[i] is read before dx[i] is written.
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

// Forward in groups of WARM_GROUP rows, each row warm-started from the previous one in its group. Fixed
// groups (not per-thread chunks) keep the result bit-identical whatever the thread count.
constexpr int64_t WARM_GROUP = 16;
template <typename T, bool ENTMAX15>
void forward_rows(const T* x, T* y, T* mt, int64_t rows, int64_t n, int threads) {
  const int64_t groups = (rows + WARM_GROUP - 1) / WARM_GROUP;
  for_rows(groups, n * WARM_GROUP, threads, [&](int64_t g) {
    T warm = -1;
    for (int64_t r = g * WARM_GROUP; r < std::min(rows, (g + 1) * WARM_GROUP); ++r)
      forward_row<T, ENTMAX15>(x + r * n, y + r * n, n, mt ? mt + 2 * r : nullptr, warm);
  });
}

}  // namespace

#define TM_DEFINE_OP(T, SUF, NAME, E15)                                                                 \
  extern "C" void tm_##NAME##_fwd_##SUF(const T* x, T* y, T* mt, int64_t rows, int64_t n, int threads) { \
    forward_rows<T, E15>(x, y, mt, rows, n, threads);                                                  \
  }                                                                                                    \
  extern "C" void tm_##NAME##_apply_##SUF(const T* x, const T* mt, T* y, int64_t rows, int64_t n,      \
                                          int threads) {                                               \
    for_rows(rows, n, threads, [&](int64_t r) { apply_row<T, E15>(x + r * n, mt + 2 * r, y + r * n, n); }); \
  }                                                                                                    \
  extern "C" void tm_##NAME##_bwd_##SUF(const T* y, const T* dy, T* dx, int64_t rows, int64_t n,       \
                                        int threads) {                                                 \
    for_rows(rows, n, threads,                                                                         \
             [&](int64_t r) { backward_row<T, E15>(y + r * n, dy + r * n, dx + r * n, n); });          \
  }
#define TM_DEFINE(T, SUF)                 \
  TM_DEFINE_OP(T, SUF, entmax15, true)    \
  TM_DEFINE_OP(T, SUF, sparsemax, false)

TM_DEFINE(float, f32)
TM_DEFINE(double, f64)

// Lets Python check that the library it loaded matches the source it hashed.
extern "C" int tm_abi_version() { return 2; }
extern "C" void tm_set_max_sweeps(int n) { g_max_sweeps = n; }
