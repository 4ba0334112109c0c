// trainc C++ kernel prelude: dtype conversions, NaN-aware math, Python integer semantics, Philox.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <omp.h>

static inline float bf2f(uint16_t v) { uint32_t u = (uint32_t)v << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline uint16_t f2bf(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN, as c10::BFloat16
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return (uint16_t)(u >> 16);
}
static inline float round_bf16(float f) { return bf2f(f2bf(f)); }
static inline float round_f16(float f) { return (float)(_Float16)f; }

// NaN-propagating: a NaN b fails the compare and is picked; two selects keep loops vectorizable
template <typename T> static inline T tc_max(T a, T b) { T m = a > b ? a : b; return (a != a) ? a : m; }
template <typename T> static inline T tc_min(T a, T b) { T m = a < b ? a : b; return (a != a) ? a : m; }
// sign(NaN) = 0 and sign(-0.0) = 0, as torch.sign on CPU.
template <typename T> static inline T tc_sign(T a) { return a > 0 ? T(1) : (a < 0 ? T(-1) : T(0)); }
template <typename T> static inline T tc_floordiv(T a, T b) {
  T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q;
}
template <typename T> static inline T tc_mod(T a, T b) {
  T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r;
}
static inline float tc_fmod_py(float a, float b) { float r = std::fmod(a, b); if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
static inline double tc_fmod_py(double a, double b) { double r = std::fmod(a, b); if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }

// Philox4x32-10, first output word at counter (c, 0, 0, 0), mapped like triton's uint_to_uniform_float.
static inline float philox_uniform(int64_t seed, int64_t counter) {
  uint32_t c0 = (uint32_t)counter, c1 = 0, c2 = 0, c3 = 0;
  uint32_t k0 = (uint32_t)(seed & 0xffffffffLL), k1 = (uint32_t)((seed >> 32) & 0xffffffffLL);
  for (int i = 0; i < 10; ++i) {
    uint64_t p0 = (uint64_t)c0 * 0xD2511F53ull, p2 = (uint64_t)c2 * 0xCD9E8D57ull;
    uint32_t n0 = (uint32_t)(p2 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p2; c3 = (uint32_t)p0; c0 = n0; c2 = n2;
    k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
  }
  int32_t x = (int32_t)c0;
  if (x < 0) x = ~x;
  return (float)x * 4.6566127342e-10f;
}

// Branch-free float exp/erf/tanh that GCC inlines and vectorizes (std:: ones stay scalar).
// Their polynomials use explicit fused multiply-adds: kernels build with -ffp-contract=off (no
// contraction eager would not do), but here FMAs are both more accurate and, on the long
// dependent Horner chains, ~20% faster.
#define TC_FMA(a, b, c) __builtin_fmaf(a, b, c)
static inline float tc_exp(float x) {
  float xc = std::min(std::max(x, -104.0f), 89.0f);
  float n = std::floor(TC_FMA(xc, 1.44269504088896341f, 0.5f));
  float r = TC_FMA(-n, 0.693359375f, xc);
  r = TC_FMA(n, 2.12194440e-4f, r);  // Cody-Waite: ln2 = 0.693359375 - 2.12194440e-4
  float p = 1.9875691500e-4f;
  p = TC_FMA(p, r, 1.3981999507e-3f); p = TC_FMA(p, r, 8.3334519073e-3f);
  p = TC_FMA(p, r, 4.1665795894e-2f); p = TC_FMA(p, r, 1.6666665459e-1f);
  p = TC_FMA(p, r, 5.0000001201e-1f);
  float y = TC_FMA(p * r, r, r) + 1.0f;
  int32_t ni = (int32_t)n, n1 = ni / 2, n2 = ni - n1;  // two scalings reach denormals
  int32_t b1 = (n1 + 127) << 23, b2 = (n2 + 127) << 23;
  float s1, s2; std::memcpy(&s1, &b1, 4); std::memcpy(&s2, &b2, 4);
  y = y * s1 * s2;
  y = x > 88.72283935546875f ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;
}
static inline double tc_exp(double x) { return std::exp(x); }
static inline float tc_erf(float x) {
  float z = std::abs(x), x2 = x * x;
  // |x| < 0.5: Taylor series; else Numerical Recipes' erfc (fractional error < 1.2e-7)
  float s = -0.0008548325929187668f;
  s = TC_FMA(s, x2, 0.005223977625442188f); s = TC_FMA(s, x2, -0.026866170645131252f);
  s = TC_FMA(s, x2, 0.11283791670955126f); s = TC_FMA(s, x2, -0.37612638903183754f);
  s = TC_FMA(s, x2, 1.1283791670955126f);
  float small = x * s;
  float t = 1.0f / TC_FMA(0.5f, z, 1.0f);
  float q = 0.17087277f;
  q = TC_FMA(q, t, -0.82215223f); q = TC_FMA(q, t, 1.48851587f); q = TC_FMA(q, t, -1.13520398f);
  q = TC_FMA(q, t, 0.27886807f); q = TC_FMA(q, t, -0.18628806f); q = TC_FMA(q, t, 0.09678418f);
  q = TC_FMA(q, t, 0.37409196f); q = TC_FMA(q, t, 1.00002368f);
  float poly = TC_FMA(t, q, -z * z - 1.26551223f);
  float big = TC_FMA(-t, tc_exp(poly), 1.0f);
  big = x < 0 ? -big : big;
  return z < 0.5f ? small : big;
}
static inline double tc_erf(double x) { return std::erf(x); }
static inline float tc_tanh(float x) {
  // |x| < 0.55: x + x^3 p(x^2), Taylor to x^19 (truncation < 1e-8 relative); above, 1 - 2/(e^2z + 1)
  // loses no more than a bit to cancellation (at 0.2 it lost 2-3: up to 5.5 ulp before)
  float z = std::abs(x), x2 = x * x;
  float p = -2.3912911e-4f;
  p = TC_FMA(p, x2, 5.9002744e-4f); p = TC_FMA(p, x2, -1.4558344e-3f);
  p = TC_FMA(p, x2, 3.5921280e-3f); p = TC_FMA(p, x2, -8.8632355e-3f);
  p = TC_FMA(p, x2, 2.1869488e-2f); p = TC_FMA(p, x2, -5.3968254e-2f);
  p = TC_FMA(p, x2, 1.3333333e-1f); p = TC_FMA(p, x2, -3.3333333e-1f);
  float small = TC_FMA(x * x2, p, x);
  float big = 1.0f - 2.0f / (tc_exp(2.0f * z) + 1.0f);
  big = x < 0 ? -big : big;
  return z < 0.55f ? small : (x != x ? x : big);
}
static inline double tc_tanh(double x) { return std::tanh(x); }
