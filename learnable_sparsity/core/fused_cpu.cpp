// Fused CPU kernels of the sparse normalizers: sparsemax, 1.5-entmax, α-entmax and top-k softmax,
// forward and backward, one pass of small loops per row instead of several eager torch ops per
// solver iteration. Built and loaded by learnable_sparsity/core/fused.py; the math is the one documented
// in learnable_sparsity/core/normalizers.py, whose eager solvers stay the fall-back and the oracle.
//
// Every kernel works on a contiguous [rows, d] array (the normalised dimension last); masked
// entries arrive as -inf. A row with a NaN or +inf gives NaN everywhere (output and gradients), a
// row with no finite entry gives zeros (and zero gradients), as the eager path does. Rows are split
// across OpenMP threads; linked against torch's libgomp (same SONAME), the pool is torch's own.
//
// Per row, the forward pass finds the row max m, packs the candidates — entries whose scaled
// score z = β(x − m) exceeds −1, the lowest threshold any solver step can reach — into a small
// buffer, solves for the threshold on them, and writes p. The loops over the candidates and over
// the row are branch-free so that the compiler vectorises them (`omp simd` lets it reorder the
// sums, which it otherwise must not); exp and log in float are Cephes-style polynomials (≤ 2 ulp)
// for the same reason.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

// Cap on the exact solvers' Newton steps (as _EXACT_MAX_ITER in normalizers.py); rows still
// unverified after it take the sort-based threshold. The tests build with a cap of 0 to check
// that fall-back.
#ifndef LS_EXACT_MAX_ITER
#define LS_EXACT_MAX_ITER 32
#endif
constexpr int kExactMaxIter = LS_EXACT_MAX_ITER;
// Below this α − 1 a row is softmax (normalizers._MIN_BETA).
constexpr double kMinBeta = 1e-7;
// Below this α − 1 a float row of α-entmax is solved in double: the float solve raises
// 1 + z − τ to the power 1/β, which multiplies its rounding by 1/β (measured against a float64
// oracle on randn rows: 2.5e-5 at β = 1e-4, 3e-7 at 1e-2, where the eager solver's log1p keeps
// 1e-7). The models keep α ≥ 1.01, so their rows stay on the float path.
constexpr double kDoubleBelowBeta = 1e-2;
// α-gradient switches to its cancellation-free form below this α − 1 (normalizers).
constexpr double kStableAlphaGradBelow = 0.5;
// Rows × d below which one thread does the whole call: forking costs more than it saves.
constexpr int64_t kParallelWork = 16384;

// Sums over a row accumulate in its own precision up to this many entries (each lane of a float
// vector then adds a few hundred terms) and in double beyond: a float sum over a 64K-entry row
// drifts by ~1e-5.
constexpr int64_t kNarrowSumUpTo = 4096;
// Rows at least this long are solved on their packed candidates (see forward_row), shorter ones
// in place: the exact solvers' passes are a few vectorised compares and adds per entry, cheaper
// than packing (a scalar loop) unless the row is long; α-entmax's passes take a log and an exp
// per entry, which packing saves sooner.
constexpr int64_t kExactPackFrom = 128;
constexpr int64_t kEntmaxPackFrom = 16;
// Top-k finds the k-th largest entry by k passes of vectorised max-and-count up to this k, and
// by nth_element (a copy and a partial sort) beyond.
constexpr int64_t kTopkPassesUpTo = 32;

template <typename T>
constexpr T kInf = std::numeric_limits<T>::infinity();
template <typename T>
constexpr T kNaN = std::numeric_limits<T>::quiet_NaN();

// ------------------------------------------------------------------ exp and log

// The build allows reassociation (-fassociative-math) so that the compiler sums vectors in a
// tree; the range reductions below must keep their order, which this barrier enforces.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define LS_KEEP_ORDER(x) __builtin_assoc_barrier(x)
#elif defined(__clang__)
#define LS_KEEP_ORDER(x) __arithmetic_fence(x)
#else
#error "fused_cpu.cpp needs GCC >= 12 or clang (an association barrier)"
#endif

inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

inline int32_t float_to_bits(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

// e^x for x ≤ 88; below −87.3 it returns about 2^−126 instead of a denormal (callers zero the
// entries that must be exactly 0). Cody–Waite reduction by ln 2, degree-6 polynomial.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.3f), 88.3f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = LS_KEEP_ORDER(x - n * 0.693359375f) + n * 2.12194440e-4f;
  const float r2 = r * r;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r2 + r + 1.0f;
  return y * bits_to_float((static_cast<int32_t>(n) + 127) << 23);
}

// log x for a positive normal x (callers select away x = 0). Mantissa in [√½, √2), degree-9
// polynomial of Cephes' logf.
inline float log_approx(float x) {
  const int32_t bits = float_to_bits(x);
  float e = static_cast<float>(((bits >> 23) & 0xff) - 126);
  float m = bits_to_float((bits & 0x007fffff) | 0x3f000000);  // x = m 2^e, m ∈ [½, 1)
  const bool low = m < 0.707106781186547524f;
  e = low ? e - 1.0f : e;
  m = low ? m + m - 1.0f : m - 1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y = LS_KEEP_ORDER(y + -2.12194440e-4f * e);
  y = LS_KEEP_ORDER(y + -0.5f * z);
  return LS_KEEP_ORDER(m + y) + 0.693359375f * e;
}

// e^y − 1 without cancellation near 0: a Taylor polynomial for |y| < 0.3 (truncation below
// 1e-10 relative), e^y − 1 beyond (at most a few ulps there).
inline float expm1_approx(float y) {
  if (std::abs(y) >= 0.3f) return exp_approx(y) - 1.0f;
  float t = 1.0f / 40320;
  t = t * y + 1.0f / 5040;
  t = t * y + 1.0f / 720;
  t = t * y + 1.0f / 120;
  t = t * y + 1.0f / 24;
  t = t * y + 1.0f / 6;
  t = t * y + 0.5f;
  return (t * y + 1.0f) * y;
}

inline float fexp(float x) { return exp_approx(x); }
inline double fexp(double x) { return std::exp(x); }
inline float fexpm1(float x) { return expm1_approx(x); }
inline double fexpm1(double x) { return std::expm1(x); }
inline float flog(float x) { return log_approx(x); }
inline double flog(double x) { return std::log(x); }

// ------------------------------------------------------------------ per-row helpers

// f(A{}) with A the accumulator of sums over n entries of T (see kNarrowSumUpTo).
template <typename T, typename F>
void with_accumulator(int64_t n, F&& f) {
  if (n <= kNarrowSumUpTo) {
    f(T{});
  } else {
    f(double{});
  }
}

template <typename T>
struct RowStart {
  T max;
  bool nan;
};

template <typename T>
RowStart<T> row_start(const T* x, int64_t d) {
  T m = -kInf<T>;
  bool nan = false;
#pragma omp simd reduction(max : m) reduction(| : nan)
  for (int64_t i = 0; i < d; ++i) {
    m = x[i] > m ? x[i] : m;
    nan |= x[i] != x[i];
  }
  // A +inf score makes the row NaN, as torch.softmax does (inf − inf in x − max x).
  return {m, nan || m == kInf<T>};
}

template <typename T>
void fill(T* y, int64_t d, T value) {
  std::fill(y, y + d, value);
}

// Sort-based exact thresholds (the eager code's internal oracle), on a copy of the candidates.
template <typename T>
T sparsemax_threshold_sort(const T* z, int64_t n, std::vector<T>& sorted) {
  sorted.assign(z, z + n);
  std::sort(sorted.begin(), sorted.end(), std::greater<T>());
  double sum = 0;
  T tau = sorted[0] - 1;
  for (int64_t k = 1; k <= n; ++k) {
    sum += sorted[k - 1];
    const T candidate = T((sum - 1) / double(k));
    if (sorted[k - 1] > candidate) tau = candidate;
  }
  return tau;
}

template <typename T>
T entmax15_threshold_sort(const T* z, int64_t n, std::vector<T>& sorted) {
  sorted.assign(z, z + n);
  std::sort(sorted.begin(), sorted.end(), std::greater<T>());
  double sum = 0, sum_sq = 0;
  T tau = sorted[0] - 1;
  for (int64_t k = 1; k <= n; ++k) {
    const T v = sorted[k - 1];
    sum += v;
    sum_sq += double(v) * v;
    const T mean = T(sum / double(k)), mean_sq = T(sum_sq / double(k));
    const T delta = (1 - T(k) * (mean_sq - mean * mean)) / T(k);
    const T candidate = mean - std::sqrt(std::max(delta, T(0)));
    if (candidate <= v) tau = candidate;
  }
  return tau;
}

// Exact sparsemax threshold of candidates z (max 0): Michelot's steps τ ← (Σ_S z − 1)/|S| on
// S = {z > τ} from τ = −1 never overshoot; once S survives a step, τ is its exact threshold.
template <typename T, typename A>
T sparsemax_threshold(const T* z, int64_t n, std::vector<T>& sorted) {
  T tau = -1;
  T size = -1;
  for (int it = 0; it < kExactMaxIter; ++it) {
    T count = 0;
    A sum = 0;
#pragma omp simd reduction(+ : count, sum)
    for (int64_t i = 0; i < n; ++i) {
      const bool in = z[i] > tau;
      count += in;
      sum += in ? z[i] : T(0);
    }
    if (count == size) return tau;
    tau = T((sum - 1) / std::max(count, T(1)));
    size = count;
  }
  return sparsemax_threshold_sort(z, n, sorted);
}

// Exact threshold for p = [z − τ]_+² (z = (x − max)/2): Newton on the convex ‖[z − τ]_+‖₂ − 1
// from τ = −1; once a step leaves the support S unchanged, the smaller root τ_S of
// Σ_S (z − τ)² = 1 is the threshold iff every z in S still exceeds it.
template <typename T, typename A>
T entmax15_threshold(const T* z, int64_t n, std::vector<T>& sorted) {
  T tau = -1;
  T size = -1;
  for (int it = 0; it < kExactMaxIter; ++it) {
    T count = 0;
    A sum = 0, sum_sq = 0;
#pragma omp simd reduction(+ : count, sum, sum_sq)
    for (int64_t i = 0; i < n; ++i) {
      const T gap = std::max(z[i] - tau, T(0));
      count += gap > 0;
      sum += gap;
      sum_sq += gap * gap;
    }
    const T s1 = T(sum), s2 = T(sum_sq);
    if (count == size) {
      const T disc = std::max(s1 * s1 - count * (s2 - 1), T(0));
      const T delta = std::max((s1 - std::sqrt(disc)) / std::max(count, T(1)), T(0));
      T kept = 0;
#pragma omp simd reduction(+ : kept)
      for (int64_t i = 0; i < n; ++i) kept += z[i] - tau - delta > 0;
      if (kept == count) return tau + delta;
    }
    tau += (s2 - std::sqrt(s2)) / std::max(s1, T(1e-30));
    size = count;
  }
  return entmax15_threshold_sort(z, n, sorted);
}

// |Σp − 1| target of the general solver: a few ulps of a sum of n terms (normalizers._tolerance).
template <typename T>
T tolerance(int64_t n) {
  int bits = 0;
  for (int64_t v = std::max<int64_t>(n, 1); v > 0; v >>= 1) ++bits;
  return 4 * std::numeric_limits<T>::epsilon() * T(bits);
}

// s = base^{1/β − 1} and p = s · base for base = 1 + z − u; p = s = 0 where base ≤ 0.
// Returns Σp and Σs.
template <typename T, typename A>
void entmax_terms(const T* z, int64_t n, T u, T inv_beta_m1, T* p, T* mass, T* s_sum) {
  A total = 0, total_s = 0;
#pragma omp simd reduction(+ : total, total_s)
  for (int64_t i = 0; i < n; ++i) {
    const T base = T(1) + z[i] - u;
    const bool on = base > 0;
    const T s = on ? fexp(flog(on ? base : T(1)) * inv_beta_m1) : T(0);
    const T pi = on ? s * base : T(0);  // base is −inf at masked entries
    p[i] = pi;
    total += pi;
    total_s += s;
  }
  *mass = T(total);
  *s_sum = T(total_s);
}

// A lower bound of the root u* of Σ_i (1 + z_i − u)_+^{1/β} = 1 for α ≤ 2 (1/β ≥ 1), in one pass
// without a log or an exp per entry. For any set S of entries, Jensen's inequality for the
// convex b ↦ b_+^{1/β} gives Σ_S (b_i)_+^{1/β} ≥ |S| (mean_S b)^{1/β}, which is 1 at
// u_S = mean_S(1 + z) − |S|^{−β}; so the full sum is ≥ 1 there and u_S ≤ u*. S = the entries
// with 1 + z > 0 (for sparsemax, Michelot's first step). Re-taking S at the bound, as Michelot
// does, measured slower: the passes cost more than the Newton steps they save.
template <typename T, typename A>
T jensen_lower_bound(const T* z, int64_t n, T beta) {
  T count = 0;
  A sum = 0;
#pragma omp simd reduction(+ : count, sum)
  for (int64_t i = 0; i < n; ++i) {
    const bool in = z[i] > T(-1);
    count += in;
    sum += in ? T(1) + z[i] : T(0);
  }
  return std::max(T(0), T(sum / count) - fexp(-beta * flog(count)));
}

// u = τ + 1 of α-entmax on scores z = β(x − max): Newton on (Σp)^β − 1 inside a bisection
// bracket [0, 1 − n^{−β}], as normalizers._entmax_root (see there for the stopping rules), from
// the Jensen lower bound for α ≤ 2 (where the steps climb monotonically to the root).
// Leaves the normalised p in p.
template <typename T, typename A>
void entmax_root(const T* z, int64_t n, T beta, T* p) {
  const T eps = std::numeric_limits<T>::epsilon();
  const T tol = tolerance<T>(n);
  const int max_iter = 2 * static_cast<int>(std::lround(-std::log2(eps)));
  const T inv_beta_m1 = 1 / beta - 1;
  T hi = -fexpm1(-beta * flog(T(n)));
  T lo = beta <= 1 ? std::min(jensen_lower_bound<T, A>(z, n, beta), hi) : T(0);
  T u = lo;
  T prev_err = kInf<T>;
  T mass = 0, s_sum = 0;
  bool current = false;  // whether p holds the terms at u
  for (int it = 0; it < max_iter; ++it) {
    entmax_terms<T, A>(z, n, u, inv_beta_m1, p, &mass, &s_sum);
    current = true;
    const T err = mass - 1;
    if (std::abs(err) <= tol || mass == 0) break;
    if (err > 0) lo = u;
    if (err < 0) hi = u;
    if (hi - lo <= 2 * eps * hi) break;
    current = false;
    // Scalar math per step, in the polynomials: libm's calls cost as much as a vector pass.
    const T log_mass = flog(mass);
    const T newton = u + fexpm1(beta * log_mass) * fexp((1 - beta) * log_mass) / s_sum;
    const bool slow = std::abs(err) > T(0.5) * prev_err && beta > 1;
    u = (newton <= lo || newton >= hi || slow) ? (lo + hi) / 2 : newton;
    prev_err = std::abs(err);
  }
  if (!current) entmax_terms<T, A>(z, n, u, inv_beta_m1, p, &mass, &s_sum);
  const T inv = 1 / mass;
  for (int64_t i = 0; i < n; ++i) p[i] *= inv;
}

// Entries per vector register at most (AVX-512 float). The solvers run on a multiple of it,
// padded with −inf (which no solver counts): a loop's tail would otherwise run one entry at a
// time, and the log and exp of α-entmax make that slow.
constexpr int64_t kLanes = 16;

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// Per-thread row buffers, with room for the padding.
template <typename T>
struct Scratch {
  std::vector<T> z, p, sorted;
  std::vector<int32_t> index;
  explicit Scratch(int64_t d) : z(padded(d) + kLanes), p(padded(d)), index(padded(d) + kLanes) {}
};

// The candidates z = β(x − m) > −1 of a row and their positions, packed; returns their number.
// With AVX-512, sixteen at a time: compress in a register, then one full store (a compressing
// store to memory is microcoded on some CPUs); the slack of the buffers takes the tail.
template <typename T>
int64_t pack_candidates(const T* x, int64_t d, T m, T beta, T* z, int32_t* index) {
  int64_t n = 0, i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    const __m512 shift = _mm512_set1_ps(m), scale = _mm512_set1_ps(beta);
    const __m512 floor = _mm512_set1_ps(-1.0f);
    __m512i position = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= d; i += 16) {
      const __m512 zi = _mm512_mul_ps(scale, _mm512_sub_ps(_mm512_loadu_ps(x + i), shift));
      const __mmask16 keep = _mm512_cmp_ps_mask(zi, floor, _CMP_GT_OQ);
      _mm512_storeu_ps(z + n, _mm512_maskz_compress_ps(keep, zi));
      _mm512_storeu_si512(index + n, _mm512_maskz_compress_epi32(keep, position));
      n += __builtin_popcount(keep);
      position = _mm512_add_epi32(position, _mm512_set1_epi32(16));
    }
  }
#endif
  for (; i < d; ++i) {  // branch-free compaction
    const T zi = beta * (x[i] - m);
    z[n] = zi;
    index[n] = static_cast<int32_t>(i);
    n += zi > T(-1);
  }
  return n;
}

inline int threads_for(int64_t rows, int64_t d, int threads) {
  return rows * d < kParallelWork ? 1 : std::max(threads, 1);
}

enum class Mapping { kSparsemax, kEntmax15, kEntmax };

// p = mapping(z) of scaled scores z (max 0) into p, both of length n.
template <Mapping M, typename T, typename A>
void solve(const T* z, int64_t n, T beta, T* p, std::vector<T>& sorted) {
  if (M == Mapping::kSparsemax) {
    const T tau = sparsemax_threshold<T, A>(z, n, sorted);
    for (int64_t i = 0; i < n; ++i) p[i] = std::max(z[i] - tau, T(0));
  } else if (M == Mapping::kEntmax15) {
    const T tau = entmax15_threshold<T, A>(z, n, sorted);
    for (int64_t i = 0; i < n; ++i) {
      const T gap = std::max(z[i] - tau, T(0));
      p[i] = gap * gap;
    }
  } else {
    entmax_root<T, A>(z, n, beta, p);
  }
}

// One row of sparsemax, 1.5-entmax or α-entmax (α − 1 = beta ≥ kMinBeta). A long row is solved
// on its candidates — the entries with z = β(x − max) > −1, the lowest threshold any solver step
// reaches — packed into scratch; a short row on all of z (z ≤ −1 is never in the support, and
// −inf stays −inf).
template <Mapping M, typename T, typename A>
void forward_row(const T* x, T m, T beta, T* y, int64_t d, Scratch<T>& scratch) {
  T* z = scratch.z.data();
  T* p = scratch.p.data();
  const bool packed = d >= (M == Mapping::kEntmax ? kEntmaxPackFrom : kExactPackFrom);
  int64_t n = d;
  if (packed) {
    n = pack_candidates(x, d, m, beta, z, scratch.index.data());
  } else {
    for (int64_t i = 0; i < d; ++i) z[i] = beta * (x[i] - m);
  }
  const int64_t width = padded(n);
  std::fill(z + n, z + width, -kInf<T>);
  solve<M, T, A>(z, width, beta, p, scratch.sorted);
  if (packed) {
    fill(y, d, T(0));
    for (int64_t i = 0; i < n; ++i) y[scratch.index[i]] = p[i];
  } else {
    std::copy(p, p + d, y);
  }
}

// Forward of sparsemax (alpha null), 1.5-entmax (alpha null) or α-entmax (alpha: one α per row).
// A float row solved in double (kDoubleBelowBeta): its input, output and buffers.
struct WideRow {
  std::vector<double> row, y;
  Scratch<double> scratch;
  explicit WideRow(int64_t d) : row(d), y(d), scratch(d) {}
};

template <Mapping M, typename T>
void forward(const T* x, const T* alpha, T* y, int64_t rows, int64_t d, int threads) {
#pragma omp parallel num_threads(threads_for(rows, d, threads))
  {
    Scratch<T> scratch(d);
    std::optional<WideRow> wide;  // made on the first such row
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * d;
      T* yr = y + r * d;
      const RowStart<T> start = row_start(xr, d);
      const T beta = M == Mapping::kSparsemax  ? T(1)
                     : M == Mapping::kEntmax15 ? T(0.5)
                                               : std::max(alpha[r] - 1, T(kMinBeta));
      if (start.nan) {
        fill(yr, d, kNaN<T>);
      } else if (start.max == -kInf<T>) {
        fill(yr, d, T(0));
      } else if (M == Mapping::kEntmax && alpha[r] - 1 < T(kMinBeta)) {
        // The α → 1 limit, exactly: softmax.
        double total = 0;
        for (int64_t i = 0; i < d; ++i) {
          yr[i] = std::exp(xr[i] - start.max);
          total += yr[i];
        }
        const T inv = T(1 / total);
        for (int64_t i = 0; i < d; ++i) yr[i] *= inv;
      } else if (M == Mapping::kEntmax && std::is_same_v<T, float> && beta < T(kDoubleBelowBeta)) {
        if (!wide) wide.emplace(d);
        std::vector<double>& row = wide->row;
        std::copy(xr, xr + d, row.begin());
        forward_row<M, double, double>(row.data(), double(start.max), double(alpha[r]) - 1,
                                        wide->y.data(), d, wide->scratch);
        std::copy(wide->y.begin(), wide->y.end(), yr);
      } else {
        with_accumulator<T>(d, [&](auto zero) {
          forward_row<M, T, decltype(zero)>(xr, start.max, beta, yr, d, scratch);
        });
      }
    }
  }
}

// ∂L/∂x = s ⊙ (g − ⟨s, g⟩/Σs) with s = 1[p > 0] (sparsemax) or √p (1.5-entmax), one row.
template <Mapping M, typename T, typename A>
void backward_exact_row(const T* p, const T* grad, T* grad_x, int64_t d) {
  A s_sum = 0, sg = 0;
#pragma omp simd reduction(+ : s_sum, sg)
  for (int64_t i = 0; i < d; ++i) {
    const T s = M == Mapping::kSparsemax ? T(p[i] > 0) : std::sqrt(p[i]);
    s_sum += s;
    sg += s * grad[i];
  }
  const T mean = T(sg / std::max(s_sum, A(std::numeric_limits<T>::min())));
  for (int64_t i = 0; i < d; ++i) {
    const T s = M == Mapping::kSparsemax ? T(p[i] > 0) : std::sqrt(p[i]);
    grad_x[i] = s * (grad[i] - mean);
  }
}

template <Mapping M, typename T>
void backward_exact(const T* p, const T* grad, T* grad_x, int64_t rows, int64_t d, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads_for(rows, d, threads))
  for (int64_t r = 0; r < rows; ++r) {
    if (p[r * d] != p[r * d]) {  // a NaN row is NaN in every entry
      fill(grad_x + r * d, d, kNaN<T>);
      continue;
    }
    with_accumulator<T>(d, [&](auto zero) {
      backward_exact_row<M, T, decltype(zero)>(p + r * d, grad + r * d, grad_x + r * d, d);
    });
  }
}

// φ(y) = (e^y − 1 − y)/y² for y ≥ 0 without cancellation near 0 (normalizers).
template <typename T>
T expm1_minus_x_over_x2(T y) {
  const T series = T(1) / 2 + y * (T(1) / 6 + y * (T(1) / 24 + y * (T(1) / 120 + y / 720)));
  const T big = y < T(0.1) ? T(1) : y;
  const T direct = (fexp(big) - 1 - big) / (big * big);
  return y < T(0.1) ? series : direct;
}

// α-entmax backward of one row: ∂L/∂x = s ⊙ (g − ⟨s, g⟩/Σs), s = p^{2−α}; returns Σ_i g_i ∂p_i/∂α
// (normalizers._alpha_grad: the direct form, or the stable one below α − 1 = ½) when wanted.
template <typename T, typename A>
T backward_entmax_row(const T* p, T alpha, const T* grad, T* grad_x, int64_t d, T* log_p, T* s,
                      bool alpha_grad) {
  const T beta = std::max(alpha - 1, T(0));
  A s_total = 0, sg_total = 0, gp_total = 0, gp_log_total = 0, neg_entropy_total = 0;
#pragma omp simd reduction(+ : s_total, sg_total, gp_total, gp_log_total, neg_entropy_total)
  for (int64_t i = 0; i < d; ++i) {
    const bool on = p[i] > 0;
    const T lp = on ? flog(on ? p[i] : T(1)) : T(0);
    const T si = on ? fexp((1 - beta) * lp) : T(0);
    log_p[i] = lp;
    s[i] = si;
    s_total += si;
    sg_total += si * grad[i];
    gp_total += grad[i] * p[i];
    gp_log_total += grad[i] * p[i] * lp;
    neg_entropy_total += p[i] * lp;
  }
  const T s_sum = std::max(T(s_total), std::numeric_limits<T>::min());
  const T mean = T(sg_total) / s_sum;
  for (int64_t i = 0; i < d; ++i) grad_x[i] = s[i] * (grad[i] - mean);
  if (!alpha_grad) return 0;
  const T gp_sum = T(gp_total), gp_log = T(gp_log_total), neg_entropy = T(neg_entropy_total);
  if (beta >= T(kStableAlphaGradBelow)) {
    return (gp_sum - mean) / (beta * beta) - (gp_log - mean * neg_entropy) / beta;
  }
  A p_rho_total = 0, gp_rho_total = 0;
#pragma omp simd reduction(+ : p_rho_total, gp_rho_total)
  for (int64_t i = 0; i < d; ++i) {
    const T rho = log_p[i] * log_p[i] * expm1_minus_x_over_x2(-beta * log_p[i]);
    p_rho_total += p[i] * rho;
    gp_rho_total += grad[i] * p[i] * rho;
  }
  const T p_rho = T(p_rho_total), gp_rho = T(gp_rho_total);
  return (gp_sum * p_rho - gp_rho + beta * (neg_entropy * gp_rho - p_rho * gp_log)) / s_sum;
}

// The support (p > 0) of a row with its gradient entries and positions, packed; returns its size.
// As pack_candidates: sixteen at a time with AVX-512, into buffers with a vector of slack.
template <typename T>
int64_t pack_support(const T* p, const T* grad, int64_t d, T* p_out, T* grad_out,
                     int32_t* index) {
  int64_t n = 0, i = 0;
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    __m512i position = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= d; i += 16) {
      const __m512 pi = _mm512_loadu_ps(p + i);
      const __mmask16 keep = _mm512_cmp_ps_mask(pi, _mm512_setzero_ps(), _CMP_GT_OQ);
      _mm512_storeu_ps(p_out + n, _mm512_maskz_compress_ps(keep, pi));
      _mm512_storeu_ps(grad_out + n, _mm512_maskz_compress_ps(keep, _mm512_loadu_ps(grad + i)));
      _mm512_storeu_si512(index + n, _mm512_maskz_compress_epi32(keep, position));
      n += __builtin_popcount(keep);
      position = _mm512_add_epi32(position, _mm512_set1_epi32(16));
    }
  }
#endif
  for (; i < d; ++i) {  // branch-free compaction
    p_out[n] = p[i];
    grad_out[n] = grad[i];
    index[n] = static_cast<int32_t>(i);
    n += p[i] > 0;
  }
  return n;
}

// grad_alpha (may be null: not wanted) gets the per-row α-gradient. Each row is differentiated on
// its packed support (padded with p = 0 to whole vectors), where the logs and exps are needed.
template <typename T>
void backward_entmax(const T* p, const T* alpha, const T* grad, T* grad_x, T* grad_alpha,
                     int64_t rows, int64_t d, int threads) {
#pragma omp parallel num_threads(threads_for(rows, d, threads))
  {
    const int64_t room = padded(d) + kLanes;
    std::vector<T> support_p(room), support_grad(room), support_grad_x(room), log_p(room),
        s(room);
    std::vector<int32_t> index(room);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      T per_row = kNaN<T>;
      T* out = grad_x + r * d;
      if (p[r * d] != p[r * d]) {
        fill(out, d, kNaN<T>);
      } else {
        const int64_t n =
            pack_support(p + r * d, grad + r * d, d, support_p.data(), support_grad.data(),
                         index.data());
        const int64_t width = padded(n);
        std::fill(support_p.begin() + n, support_p.begin() + width, T(0));
        std::fill(support_grad.begin() + n, support_grad.begin() + width, T(0));
        with_accumulator<T>(d, [&](auto zero) {
          per_row = backward_entmax_row<T, decltype(zero)>(
              support_p.data(), alpha[r], support_grad.data(), support_grad_x.data(), width,
              log_p.data(), s.data(), grad_alpha != nullptr);
        });
        fill(out, d, T(0));
        for (int64_t i = 0; i < n; ++i) out[index[i]] = support_grad_x[i];
      }
      if (grad_alpha != nullptr) grad_alpha[r] = per_row;
    }
  }
}

// The k-th largest entry of a row whose largest is m, counting ties (−inf when fewer than k are
// finite). Small k: from the largest value down, count the entries equal to the current value
// and find the next lower one, until k are counted; each step is one vectorised pass. Large k:
// nth_element on a copy.
template <typename T>
T kth_largest(const T* x, int64_t d, int64_t k, T m, std::vector<T>& buffer) {
  if (k >= d) return *std::min_element(x, x + d);
  if (k <= kTopkPassesUpTo) {
    for (int64_t counted = 0;;) {
      int64_t equal = 0;
      T below = -kInf<T>;
#pragma omp simd reduction(+ : equal) reduction(max : below)
      for (int64_t i = 0; i < d; ++i) {
        equal += x[i] == m;
        const T v = x[i] < m ? x[i] : -kInf<T>;
        below = v > below ? v : below;
      }
      counted += equal;
      if (counted >= k || m == -kInf<T>) return m;
      m = below;
    }
  }
  buffer.assign(x, x + d);
  std::nth_element(buffer.begin(), buffer.begin() + (k - 1), buffer.end(), std::greater<T>());
  return buffer[k - 1];
}

// Softmax over the entries ≥ the row's k-th largest (ties kept), zeros elsewhere; one row.
template <typename T, typename A>
void topk_softmax_row(const T* x, T m, T kth, T* y, int64_t d) {
  A total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < d; ++i) {
    const bool kept = x[i] >= kth && x[i] > -kInf<T>;
    const T e = kept ? fexp(x[i] - m) : T(0);
    y[i] = e;
    total += e;
  }
  const T inv = T(1 / total);
  for (int64_t i = 0; i < d; ++i) y[i] *= inv;
}

template <typename T>
void topk_softmax_forward(const T* x, T* y, int64_t k, int64_t rows, int64_t d, int threads) {
#pragma omp parallel num_threads(threads_for(rows, d, threads))
  {
    std::vector<T> buffer;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * d;
      T* yr = y + r * d;
      const RowStart<T> start = row_start(xr, d);
      if (start.nan || start.max == -kInf<T>) {
        fill(yr, d, start.nan ? kNaN<T> : T(0));
        continue;
      }
      const T kth = kth_largest(xr, d, k, start.max, buffer);
      with_accumulator<T>(d, [&](auto zero) {
        topk_softmax_row<T, decltype(zero)>(xr, start.max, kth, yr, d);
      });
    }
  }
}

// Softmax backward on the kept entries: ∂L/∂x = p ⊙ (g − ⟨p, g⟩), one row.
template <typename T, typename A>
void softmax_backward_row(const T* p, const T* grad, T* grad_x, int64_t d) {
  A total = 0;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < d; ++i) total += p[i] * grad[i];
  const T pg = T(total);
  for (int64_t i = 0; i < d; ++i) grad_x[i] = p[i] * (grad[i] - pg);
}

template <typename T>
void softmax_backward(const T* p, const T* grad, T* grad_x, int64_t rows, int64_t d,
                      int threads) {
#pragma omp parallel for schedule(static) num_threads(threads_for(rows, d, threads))
  for (int64_t r = 0; r < rows; ++r) {
    with_accumulator<T>(d, [&](auto zero) {
      softmax_backward_row<T, decltype(zero)>(p + r * d, grad + r * d, grad_x + r * d, d);
    });
  }
}

}  // namespace

// ------------------------------------------------------------------ C entry points (ctypes)

#define LS_EXPORT extern "C" __attribute__((visibility("default")))
#define LS_BOTH(MACRO) MACRO(f32, float) MACRO(f64, double)

#define LS_FORWARD(SUFFIX, T)                                                                  \
  LS_EXPORT void sparsemax_forward_##SUFFIX(const T* x, T* y, int64_t rows, int64_t d,      \
                                            int threads) {                                   \
    forward<Mapping::kSparsemax, T>(x, nullptr, y, rows, d, threads);                        \
  }                                                                                            \
  LS_EXPORT void entmax15_forward_##SUFFIX(const T* x, T* y, int64_t rows, int64_t d,       \
                                           int threads) {                                    \
    forward<Mapping::kEntmax15, T>(x, nullptr, y, rows, d, threads);                         \
  }                                                                                            \
  LS_EXPORT void entmax_forward_##SUFFIX(const T* x, const T* alpha, T* y, int64_t rows,    \
                                         int64_t d, int threads) {                           \
    forward<Mapping::kEntmax, T>(x, alpha, y, rows, d, threads);                             \
  }                                                                                            \
  LS_EXPORT void sparsemax_backward_##SUFFIX(const T* p, const T* grad, T* grad_x,           \
                                             int64_t rows, int64_t d, int threads) {         \
    backward_exact<Mapping::kSparsemax, T>(p, grad, grad_x, rows, d, threads);                 \
  }                                                                                            \
  LS_EXPORT void entmax15_backward_##SUFFIX(const T* p, const T* grad, T* grad_x,            \
                                            int64_t rows, int64_t d, int threads) {          \
    backward_exact<Mapping::kEntmax15, T>(p, grad, grad_x, rows, d, threads);                  \
  }                                                                                            \
  LS_EXPORT void entmax_backward_##SUFFIX(const T* p, const T* alpha, const T* grad,         \
                                          T* grad_x, T* grad_alpha, int64_t rows, int64_t d, \
                                          int threads) {                                     \
    backward_entmax<T>(p, alpha, grad, grad_x, grad_alpha, rows, d, threads);                  \
  }                                                                                            \
  LS_EXPORT void topk_softmax_forward_##SUFFIX(const T* x, T* y, int64_t k, int64_t rows,    \
                                               int64_t d, int threads) {                     \
    topk_softmax_forward<T>(x, y, k, rows, d, threads);                                        \
  }                                                                                            \
  LS_EXPORT void softmax_backward_##SUFFIX(const T* p, const T* grad, T* grad_x,             \
                                           int64_t rows, int64_t d, int threads) {           \
    softmax_backward<T>(p, grad, grad_x, rows, d, threads);                                    \
  }

LS_BOTH(LS_FORWARD)
