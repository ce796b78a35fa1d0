// deamoe_cpu.cpp: the fast CPU path of deamoe-trt.
//
// Small-batch decoding of an MoE layer is memory-bound: a step's time is the bytes of
// weights it streams divided by the machine's read bandwidth. This kernel's only job is to
// stream each weight the step needs exactly once, contiguously, with all cores, and to do
// the arithmetic on the fly:
//   - every used department's shared part is read once for all tokens that use it
//     (weighted by W_j), every used expert's private part once for its tokens (by w_e),
//     the always-on shared experts once for all tokens (by a);
//   - the weights are repacked at load time so that one neuron group (NB neurons: their
//     gate rows, up rows and down columns) is one contiguous run of memory; a block is a
//     sequence of such groups, so any range of groups is one sequential stream;
//   - a step is cut into a fixed number of slices (step_slices: more than threads), each
//     the same equal range of every block's neuron groups, accumulating its share of the
//     down projection into its own partial output; threads claim slices from a counter
//     (the caller starts at once, a worker still waking up joins late), and the partials
//     are summed in slice order at the end. The result depends neither on timing nor on
//     which thread ran which slice: it is deterministic.
//   - neurons never materialise as a [T, f] intermediate: for each group, gate and up
//     dot products (fp32 accumulation), silu(g) * u * w, then the group's down columns
//     are added into the outputs while still in L1/L2.
//   - optional biases (gpt-oss) ride along without another pass over the weights: a
//     block's gate/up biases are R floats per neuron group beside its weights, added to
//     the group's dot products before the activation (silu, or the clamped SwiGLU); an
//     expert's (or the shared experts') down bias is added once per token, times its w_e,
//     by the one slice whose share of that block starts at its first group.
// Routing: dm_layer_forward computes the router logits and the routing itself (the CUDA
// kernels' routeToken from deamoeRouting.cuh, held to deamoe_trt/routing.py's decisions by
// tests/cpu and tests/native/cuda), so a layer step is one call; dm_moe_forward instead
// executes a routing the caller computed with deamoe_trt.routing.
//
// Plain C ABI (loaded with ctypes), no Python headers: built at first use with the system
// compiler and -march=native (see _build.py).

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "deamoeRouting.cuh"  // native/cuda/ (or the wheel's copy): the routing, shared with CUDA

namespace {

// ----------------------------------------------------------------------------------------
// SIMD: one vector of W floats, loaded from fp32 or fp16 weights.
// ----------------------------------------------------------------------------------------

#if defined(__AVX512F__)
constexpr int W = 16;
using V = __m512;
inline V vzero() { return _mm512_setzero_ps(); }
inline V vset1(float v) { return _mm512_set1_ps(v); }
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
// F16C-style widening: 16 halves -> 16 floats in one instruction (vcvtph2ps).
inline V vload(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline void vstore(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V vfma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline float vsum(V v) { return _mm512_reduce_add_ps(v); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vmin(V a, V b) { return _mm512_min_ps(a, b); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
inline V vround(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline V vexp2i(V a, V n) { return _mm512_scalef_ps(a, n); }  // a * 2^n, n integral
#define DEAMOE_SIMD "avx512"
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr int W = 8;
using V = __m256;
inline V vzero() { return _mm256_setzero_ps(); }
inline V vset1(float v) { return _mm256_set1_ps(v); }
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline V vload(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline void vstore(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V vfma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline float vsum(V v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
inline V vmin(V a, V b) { return _mm256_min_ps(a, b); }
inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
inline V vround(V a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline V vexp2i(V a, V n) {  // a * 2^n, n integral in [-127, 127]: add n to the exponent bits
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(a, _mm256_castsi256_ps(e));
}
#define DEAMOE_SIMD "avx2"
#else
#error "deamoe_cpu needs AVX2+FMA+F16C or AVX-512 (x86-64 from 2013 on); this CPU has neither"
#endif

// Rows are padded (with zeros) to a multiple of this many elements, so every loop below
// runs whole vectors; 16 fp32 = one 64-byte cache line.
constexpr int64_t kPad = 16;
// Neurons per group: the down projection adds NB columns per load/store of the outputs,
// which keeps the output traffic (L1/L2) well below the weight traffic (DRAM).
constexpr int NB = 4;
// Tokens handled per pass over a group (more tokens take further passes, which read the
// group from L2): 2*NB*3 accumulators + 3 activation vectors + 1 weight vector fill the 32
// vector registers of AVX-512; AVX2 has 16, enough for one token.
constexpr int kMaxTokensPerPass = W == 16 ? 3 : 1;
// Tokens per pass of the router's dot products (one row at a time, from memory once).
constexpr int kRouterTokensPerPass = 8;

// silu(x) = x / (1 + exp(-x)) for a vector, in registers: calling the C library's expf
// per neuron would spill the accumulators around each call. exp is Cephes' expf: range
// reduction by ln 2 in two parts, a degree-6 polynomial, scaling by 2^n; within 2 ulp.
inline V vexp_neg(V x);
inline V vsilu(V x) { return vdiv(x, vadd(vset1(1.0f), vexp_neg(x))); }
inline V vsigmoid(V x) { return vdiv(vset1(1.0f), vadd(vset1(1.0f), vexp_neg(x))); }

// exp(-x), with -x clamped to [-87, 88].
inline V vexp_neg(V x) {
  const V t = vmin(vmax(vsub(vzero(), x), vset1(-87.0f)), vset1(88.0f));  // -x, clamped
  const V n = vround(vmul(t, vset1(1.44269504088896341f)));
  V r = vsub(t, vmul(n, vset1(0.693359375f)));
  r = vsub(r, vmul(n, vset1(-2.12194440e-4f)));
  V p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
  return vexp2i(p, n);
}

// The layer's activation (deamoe_trt/activation.py), one per layer.
struct Activation {
  int kind;  // 0 swiglu: silu(g) * u; 1 swiglu_clamped: (u' + 1) * g' * sigmoid(alpha g')
  float alpha, limit;
};

// h = a(g, u) * w per lane; g and u already include their biases. Plain SwiGLU weighs u
// first (silu(g) * (u * w), linear in u); the clamped one weighs the activation.
inline V vactivate(const Activation& act, V g, V u, V w) {
  if (act.kind == 0) return vmul(vsilu(g), vmul(u, w));
  const V limit = vset1(act.limit);
  g = vmin(g, limit);
  u = vmin(vmax(u, vsub(vzero(), limit)), limit);
  const V glu = vmul(g, vsigmoid(vmul(vset1(act.alpha), g)));
  return vmul(vmul(glu, vadd(u, vset1(1.0f))), w);
}

// Software prefetch: every streaming loop asks for its bytes 2 KiB ahead (into L1), and some
// also 16 KiB ahead into L2 (FAR). The hardware prefetcher alone leaves a core short of its
// share of the read bandwidth:
//   - the quantized loops compute between loads: on Zen 4 one core read ~11 GB/s, ~14 GB/s
//     with the 2 KiB prefetch (1 KiB: 13, 4 KiB: 14, 8 KiB: 13); FAR made the MoE step's
//     quantized loops 8-9% faster on the one-token layer (qwen3 shapes at int4 and int8, 2
//     threads; 8 and 32 KiB the same within noise; no change from 4 tokens on). In the
//     int4 projections' loop (deamoe_cpu_model.h) FAR made the whole int4 model step of
//     bench-lm's shape 1.05x faster on Zen 4 (median of 32 alternating pairs) and 0.96-0.98x
//     on an Intel Xeon VM, so it prefetches far in kSubnormal mode (AMD's) only; the int8
//     projections do without;
//   - the float loops stream near the roof on Zen 4, where FAR cost the MoE layer's fp16
//     loops 7%. On an Intel Xeon VM (2 vCPUs) they did not: the whole fp16 model step of
//     bench-lm's shape ran 1.15x faster with the 2 KiB prefetch in the projections and the
//     FFN, 1.23x with FAR in the projections' loop as well (FAR in the FFN's too: no
//     further change), 6-8 rounds of alternating processes each.
constexpr int64_t kPrefetchBytes = 2048;
constexpr int64_t kPrefetchL2Bytes = 16384;
template <bool FAR = false>
inline void prefetch_ahead(const uint8_t* p, int64_t bytes) {
  for (int64_t i = 0; i < bytes; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + i), _MM_HINT_T0);
    if constexpr (FAR) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchL2Bytes + i), _MM_HINT_T1);
  }
}

// TT dot products of one weight row with TT activation rows, fp32 accumulation (the router).
// U independent accumulator chains per token hide the FMA latency when TT is small.
template <int TT, typename WT>
inline void dot_rows(const WT* row, const float* const* xs, int64_t n, float* out) {
  constexpr int U = TT == 1 ? 4 : (TT == 2 ? 2 : 1);
  V acc[U][TT];
  for (int u = 0; u < U; ++u)
    for (int t = 0; t < TT; ++t) acc[u][t] = vzero();
  int64_t i = 0;
  for (; i + U * W <= n; i += U * W) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const V w = vload(row + i + u * W);
#pragma GCC unroll 8
      for (int t = 0; t < TT; ++t) acc[u][t] = vfma(w, vload(xs[t] + i + u * W), acc[u][t]);
    }
  }
  for (; i < n; i += W) {
    const V w = vload(row + i);
    for (int t = 0; t < TT; ++t) acc[0][t] = vfma(w, vload(xs[t] + i), acc[0][t]);
  }
  for (int t = 0; t < TT; ++t) {
    V s = acc[0][t];
    for (int u = 1; u < U; ++u) s = vadd(s, acc[u][t]);
    out[t] = vsum(s);
  }
}

// Rows of a neuron group's gate/up part: gate and up of each of its NB neurons.
constexpr int R = 2 * NB;

// h = a(g + b_g, u + b_u) * w for the NB*TT (neuron, token) pairs of a pass, as one vector,
// from the gate (row 2n) and up (row 2n+1) accumulators; bias: the group's R gate/up biases
// (row order) or null; tok_w: the tokens' weights for this block.
template <int TT>
inline void activations(const V (&acc)[R][TT], const float* bias, const Activation& act, const float* tok_w, float* h) {
  static_assert(NB * TT <= W, "one vector holds every (neuron, token) pair of a pass");
  alignas(64) float g[W] = {}, u[W] = {}, w[W] = {};
  for (int n = 0; n < NB; ++n)
    for (int t = 0; t < TT; ++t) {
      g[n * TT + t] = vsum(acc[2 * n][t]) + (bias ? bias[2 * n] : 0.0f);
      u[n * TT + t] = vsum(acc[2 * n + 1][t]) + (bias ? bias[2 * n + 1] : 0.0f);
      w[n * TT + t] = tok_w[t];
    }
  vstore(h, vactivate(act, vload(g), vload(u), vload(w)));
}

// One neuron group for TT tokens: h = silu(x.gate) * (x.up) * weight, then y += h * down.
//
// Group layout, chosen so that the pass reads the group strictly front to back and loads
// each activation vector once per R weight vectors (a streaming core has no L1 bandwidth
// to spare for more: loading x once per weight vector costs ~20% of the read rate):
//   gate/up part: for each column chunk c (W columns): rows 0..R-1 of chunk c, where row
//                 2n is neuron n's gate row and row 2n+1 its up row;
//   down part:    for each chunk c of the output: the NB neurons' down columns, chunk c.
template <int TT, typename WT>
inline void group_pass(const WT* group, int64_t dp, const float* const* xs, const float* bias, const Activation& act,
                       const float* tok_w, float* const* ys) {
  V acc[R][TT];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) acc[r][t] = vzero();
  const WT* w = group;
  for (int64_t c = 0; c < dp; c += W, w += R * W) {
    V x[TT];
    prefetch_ahead(reinterpret_cast<const uint8_t*>(w), R * W * sizeof(WT));
    for (int t = 0; t < TT; ++t) x[t] = vload(xs[t] + c);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const V wr = vload(w + r * W);
      for (int t = 0; t < TT; ++t) acc[r][t] = vfma(wr, x[t], acc[r][t]);
    }
  }
  alignas(64) float h[W];
  activations<TT>(acc, bias, act, tok_w, h);

  // The NB down columns are added together: one load and store of each output vector
  // per NB weight vectors keeps the output traffic (L1) below the weight traffic.
  const WT* down = group + R * dp;
  for (int64_t c = 0; c < dp; c += W, down += NB * W) {
    V d[NB];
    prefetch_ahead(reinterpret_cast<const uint8_t*>(down), NB * W * sizeof(WT));
    for (int n = 0; n < NB; ++n) d[n] = vload(down + n * W);
#pragma GCC unroll 4
    for (int t = 0; t < TT; ++t) {
      // Two partial sums: half the dependent FMA chain per output vector.
      V y0 = vload(ys[t] + c), y1 = vzero();
      for (int n = 0; n < NB; n += 2) {
        y0 = vfma(vset1(h[n * TT + t]), d[n], y0);
        y1 = vfma(vset1(h[(n + 1) * TT + t]), d[n + 1], y1);
      }
      vstore(ys[t] + c, vadd(y0, y1));
    }
  }
}

template <typename WT>
void group_pass_any(int tt, const WT* group, int64_t dp, const float* const* xs, const float* bias,
                    const Activation& act, const float* tok_w, float* const* ys) {
  switch (tt) {
    case 1: return group_pass<1>(group, dp, xs, bias, act, tok_w, ys);
    case 2:
      if constexpr (kMaxTokensPerPass >= 2) return group_pass<2>(group, dp, xs, bias, act, tok_w, ys);
      break;
    case 3:
      if constexpr (kMaxTokensPerPass >= 3) return group_pass<3>(group, dp, xs, bias, act, tok_w, ys);
      break;
  }
}

template <typename WT>
void dot_rows_any(int tt, const WT* row, const float* const* xs, int64_t n, float* out) {
  switch (tt) {
    case 1: return dot_rows<1>(row, xs, n, out);
    case 2: return dot_rows<2>(row, xs, n, out);
    case 3: return dot_rows<3>(row, xs, n, out);
    case 4: return dot_rows<4>(row, xs, n, out);
    case 5: return dot_rows<5>(row, xs, n, out);
    case 6: return dot_rows<6>(row, xs, n, out);
    case 7: return dot_rows<7>(row, xs, n, out);
    case 8: return dot_rows<8>(row, xs, n, out);
  }
}

// ----------------------------------------------------------------------------------------
// Weight-only int8/int4 (deamoe_trt/quant.py): the same neuron groups and passes, but the
// weights stay packed in memory (int4: eight codes per 32-bit lane) and are turned into
// floats in registers, fp32 accumulation. Per quantization group of GS columns, a row's
// codes are dotted with x as they are, and the group's scale is applied once:
//   x . w = sum_G scale_G * (sum_{j in G} x_j q_j - zero * sum_{j in G} x_j)
// (the sums of x per group are computed once per step and shared by every row). That turns
// an int4 code into a float with an and plus an int->float conversion (exact: codes are
// small integers), or an and alone (kSubnormal, below), instead of a table lookup, which
// the CPU can only issue on its shuffle ports: on Zen 4 the bare loop runs 1.3x (and +
// convert) and 1.6x (and alone) faster than the lookup (docs/benchmarks.md).
// Layout of one quantized neuron group (written by dm_pack_q; d must be a whole number of
// quantization groups, so dp == d):
//   gate/up part: the scales, per quantization group of GS columns the R rows' (ScaleDtype,
//     the checkpoint's where it has 16 bits), padded to a cache line (q_scale_area_bytes);
//     then the codes, per quantization group, per column chunk (W columns):
//     int8: R rows of W signed codes (q - 128); int4: W 32-bit lanes, lane i holding the
//     R rows' codes of column i, row r in bits 4r..4r+3;
//   down part, per output chunk (W outputs): int8: NB neurons of W signed codes; int4: W
//     16-bit lanes, lane i holding the NB neurons' codes of output i, neuron n in bits 4n..4n+3.
// A block's down scales follow its groups: [f / GS][d] in the same ScaleDtype; a slice widens
// a row of them to fp32 once (run_tasks_q), and every neuron group of that quantization group
// reads it from L1/L2 (NB neurons never straddle one: GS is a multiple of NB).
// ----------------------------------------------------------------------------------------

constexpr int kMaxTokensPerPassQ = W == 16 ? 2 : 1;
static_assert(R == 8 && NB == 4, "int4 lanes hold R = 8 gate/up codes and NB = 4 down codes");

#if defined(__AVX512F__)
using VI = __m512i;
inline VI load_lanes(const uint8_t* p) { return _mm512_loadu_si512(p); }  // W 32-bit lanes
inline VI load_u16(const uint8_t* p) {
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline VI load_s8(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VI iand(VI a, uint32_t mask) { return _mm512_and_si512(a, _mm512_set1_epi32(static_cast<int>(mask))); }
inline VI isrl(VI a, int n) { return _mm512_srli_epi32(a, n); }
inline V to_float(VI v) { return _mm512_cvtepi32_ps(v); }
inline V as_float(VI v) { return _mm512_castsi512_ps(v); }
#else
using VI = __m256i;
inline VI load_lanes(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline VI load_u16(const uint8_t* p) {
  return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline VI load_s8(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline VI iand(VI a, uint32_t mask) { return _mm256_and_si256(a, _mm256_set1_epi32(static_cast<int>(mask))); }
inline VI isrl(VI a, int n) { return _mm256_srli_epi32(a, n); }
inline V to_float(VI v) { return _mm256_cvtepi32_ps(v); }
inline V as_float(VI v) { return _mm256_castsi256_ps(v); }
#endif

// Row r's int4 code becomes a float without leaving its lane: rows 0..3 are masked out of
// the lanes as they are, rows 4..7 out of the lanes shifted down 16 bits (once per chunk),
// which leaves the bits q * 2^(4r'), r' = r mod 4. Then, two ways:
//   kConvert: int->float: the float q * 2^(4r'). On AVX-512, rows 0 and 4 (r' = 0) are
//     looked up instead, by vpermps in a table of the floats 0..15 (it reads an index's low
//     4 bits only): one instruction for the mask and the conversion, the same float. The
//     whole int4 step ran 1.03x faster (median of 10 alternating pairs, Intel Xeon VM); the
//     other rows would need a shift each first, which made the loop slower (see
//     docs/benchmarks.md), as did the lookup for the down part's first neuron (0.98x).
//   kSubnormal: nothing: the bits read as a float are the subnormal q * 2^(4r'-149). x is
//     multiplied by 2^kSubnormalXShift once per step, so the product x * 2^64 * q * 2^(4r'-149)
//     is an ordinary float (the FMA computes it exactly). One instruction fewer per 16
//     weights: 1.3x over kConvert on the bare loop on AMD Zen 4, which takes subnormal
//     inputs at full speed; Intel's cores take a microcode assist per subnormal input (the
//     whole int4 step ran 55x slower on an Intel Xeon VM), so it is AMD's default only.
// Both are exact. Row r's sum is multiplied by kInt4RowFactor[r] (a power of two) once per
// neuron group, which undoes 2^(4r'); kSubnormal's dot products come out in 2^(64-149) and
// are multiplied by kInt4GateUpUnit (exactly) at the same time.
enum Int4Mode { kConvert = 0, kSubnormal = 1 };
constexpr int kSubnormalXShift = 64;
alignas(32) constexpr float kInt4RowFactor[R] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f, 1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f};
constexpr float kInt4GateUpUnit[2] = {1.0f, 0x1p85f};
// Down codes (NB per 16-bit lane) the same way, all from the lanes as they are: neuron n's
// code is q * 2^(4n) (kConvert) or q * 2^(4n-149) (kSubnormal); h_n is multiplied by
// kInt4NeuronFactor[mode][n], which leaves h_n * q * kInt4DownUnit[mode]. The threads'
// partial outputs are kept in that unit and divided by it (exactly) when they are summed.
constexpr float kInt4NeuronFactor[2][NB] = {{1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f}, {0x1p96f, 0x1p92f, 0x1p88f, 0x1p84f}};
constexpr float kInt4DownUnit[2] = {1.0f, 0x1p-53f};

template <int r, int MODE>
inline V int4_row_value(VI lanes, VI high) {
#if defined(__AVX512F__)
  if constexpr (MODE == kConvert && r % 4 == 0)
    return _mm512_permutexvar_ps(r < 4 ? lanes : high,
                                 _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
#endif
  const VI bits = iand(r < 4 ? lanes : high, 0xFu << (4 * (r % 4)));
  if constexpr (MODE == kSubnormal) return as_float(bits);
  return to_float(bits);
}

// out[g] = the sum of x[g * gs, (g + 1) * gs) for the n / gs groups of x (gs a multiple of
// W): the int4 zero point's share of each group, once per input row. Vector partial sums:
// a plain running sum is one dependent add per value, which the step would wait for.
inline void group_sums(const float* x, int64_t n, int64_t gs, float* out) {
  for (int64_t g = 0; g < n / gs; ++g) {
    V a0 = vzero(), a1 = vzero();
    int64_t c = 0;
    for (; c + 2 * W <= gs; c += 2 * W) {
      a0 = vadd(a0, vload(x + g * gs + c));
      a1 = vadd(a1, vload(x + g * gs + c + W));
    }
    if (c < gs) a0 = vadd(a0, vload(x + g * gs + c));
    out[g] = vsum(vadd(a0, a1));
  }
}

// Quantization scales are stored in the checkpoint's own dtype where it has 16 bits (fp16,
// bf16: a float of each converts exactly), else fp32: at group size 64, fp32 scales would be
// 12.5% on top of the int4 codes, 16-bit ones are 6.25%.
enum ScaleDtype { kScaleF32 = 0, kScaleF16 = 1, kScaleBF16 = 2 };

constexpr int scale_bytes(int scale_dtype) { return scale_dtype == kScaleF32 ? 4 : 2; }

constexpr bool valid_scale_dtype(int scale_dtype) {
  return scale_dtype == kScaleF32 || scale_dtype == kScaleF16 || scale_dtype == kScaleBF16;
}

// Four scales as floats (exact in every ScaleDtype).
inline __m128 load_scales(const uint8_t* p, int scale_dtype) {
  if (scale_dtype == kScaleF32) return _mm_loadu_ps(reinterpret_cast<const float*>(p));
  const __m128i half = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  if (scale_dtype == kScaleF16) return _mm_cvtph_ps(half);
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(half), 16));  // bf16: fp32's top half
}

// Eight scales as floats.
inline __m256 load_scales8(const uint8_t* p, int scale_dtype) {
  if (scale_dtype == kScaleF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (scale_dtype == kScaleF16) return _mm256_cvtph_ps(half);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

// A scale stored as scale_dtype, or false if that dtype cannot hold it exactly.
inline bool store_scale(float scale, int scale_dtype, uint8_t* out) {
  if (scale_dtype == kScaleF32) {
    std::memcpy(out, &scale, 4);
    return true;
  }
  uint32_t bits32;
  std::memcpy(&bits32, &scale, 4);
  const uint16_t half =
      scale_dtype == kScaleF16 ? static_cast<uint16_t>(_cvtss_sh(scale, 0)) : static_cast<uint16_t>(bits32 >> 16);
  uint8_t back[8] = {};
  std::memcpy(back, &half, 2);
  float round_trip;
  _mm_store_ss(&round_trip, load_scales(back, scale_dtype));
  if (!(round_trip == scale)) return false;
  std::memcpy(out, &half, 2);
  return true;
}

template <int BITS>
inline int64_t q_chunk_bytes() {
  return BITS == 4 ? 4 * W : R * W;
}  // one gate/up column chunk
// A neuron group: the R rows' scales of every quantization group of gs columns (scale dtype
// sd), padded to a whole number of cache lines, then the gate/up codes, then the down codes.
// The scales come first rather than beside their codes so that every code chunk starts on a
// cache line: with 16-bit scales beside them, 3 in 4 of the int4 chunks straddled two lines
// and the whole int4 step ran 0.93x (AMD EPYC VM, in one process against fp32 scales).
inline int64_t q_scale_area_bytes(int64_t gs, int64_t dp, int sd) {
  return (dp / gs * R * scale_bytes(sd) + 63) / 64 * 64;
}
inline int64_t q_gate_up_bytes(int bits, int64_t gs, int64_t dp, int sd) {
  return q_scale_area_bytes(gs, dp, sd) + R * dp * bits / 8;
}
inline int64_t q_group_bytes(int bits, int64_t gs, int64_t dp, int sd) {
  return q_gate_up_bytes(bits, gs, dp, sd) + NB * dp * bits / 8;
}
// A block of `groups` neuron groups: the groups, then the down scales [groups * NB / gs, dp].
inline int64_t q_block_bytes(int bits, int64_t gs, int64_t dp, int sd, int64_t groups) {
  return groups * q_group_bytes(bits, gs, dp, sd) + groups * NB / gs * dp * scale_bytes(sd);
}

// acc[r][t] += row r's codes (as floats, see above) * x[t] for one column chunk.
template <int TT, int BITS, int MODE, int r = 0>
inline void chunk_dot(const uint8_t* w, VI lanes, VI high, const V (&x)[TT], V (&acc)[R][TT]) {
  if constexpr (r < R) {
    V wr;
    if constexpr (BITS == 4)
      wr = int4_row_value<r, MODE>(lanes, high);
    else
      wr = to_float(load_s8(w + r * W));
    for (int t = 0; t < TT; ++t) acc[r][t] = vfma(wr, x[t], acc[r][t]);
    chunk_dot<TT, BITS, MODE, r + 1>(w, lanes, high, x, acc);
  }
}

constexpr float kUnitFactors[NB] = {1.0f, 1.0f, 1.0f, 1.0f};

// y += scale_o * sum_n h_n * (q_on - zero) for one neuron group's down part w: h [NB * TT]
// (neuron n, token t at n * TT + t), each multiplied by factors[n]; zero_term: the zero
// point in the unit of y.
template <int TT, int BITS, int MODE>
inline void down_pass_q(const uint8_t* w, int64_t dp, const float* dscale, const float* h, const float* factors,
                        float zero_term, float* const* ys) {
  float hs[NB][TT], offset[TT];
  for (int t = 0; t < TT; ++t) {
    float sum = 0.0f;
    for (int n = 0; n < NB; ++n) {
      hs[n][t] = h[n * TT + t] * factors[n];
      sum += h[n * TT + t];
    }
    offset[t] = -zero_term * sum;
  }
  for (int64_t c = 0; c < dp; c += W) {
    V d[NB];
    prefetch_ahead<true>(w, BITS == 4 ? 2 * W : NB * W);
    if constexpr (BITS == 4) {
      const VI lanes = load_u16(w);
      for (int n = 0; n < NB; ++n) {
        const VI bits = iand(lanes, 0xFu << (4 * n));
        d[n] = MODE == kSubnormal ? as_float(bits) : to_float(bits);
      }
      w += 2 * W;
    } else {
      for (int n = 0; n < NB; ++n) d[n] = to_float(load_s8(w + n * W));
      w += NB * W;
    }
    const V s = vload(dscale + c);
#pragma GCC unroll 4
    for (int t = 0; t < TT; ++t) {
      // One chain per output vector: the chunks are independent, so the core overlaps them.
      V sum = vset1(offset[t]);
      for (int n = 0; n < NB; ++n) sum = vfma(vset1(hs[n][t]), d[n], sum);
      vstore(ys[t] + c, vfma(sum, s, vload(ys[t] + c)));
    }
  }
}

// One quantized neuron group for TT tokens (see group_pass): h = silu(x.gate) * (x.up) * weight,
// then y += down * h, where dscale [dp] holds the down scales of this group's neurons and
// xsums[t] the sums of token t's x per quantization group. int4 kSubnormal: xs are x * 2^64.
template <int TT, int BITS, int MODE>
inline void group_pass_q(const uint8_t* group, int64_t dp, int64_t gs, int sd, const float* dscale,
                         const float* const* xs, const float* const* xsums, const float* bias, const Activation& act,
                         const float* tok_w, float* const* ys) {
  constexpr float zero = BITS == 4 ? 8.0f : 0.0f;  // int8 codes are stored signed
  V total[R][TT];
  __m256 corr[TT];  // per row r (lane r): sum_G scale_G,r * xsum_G, for the zero point
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < TT; ++t) total[r][t] = vzero();
  for (int t = 0; t < TT; ++t) corr[t] = _mm256_setzero_ps();
  const uint8_t* scales = group;
  const uint8_t* w = group + q_scale_area_bytes(gs, dp, sd);
  for (int64_t q0 = 0, g = 0; q0 < dp; q0 += gs, ++g) {
    const __m256 s8 = load_scales8(scales + g * R * scale_bytes(sd), sd);
    alignas(32) float scale[R];
    _mm256_store_ps(scale, s8);
    V acc[R][TT];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < TT; ++t) acc[r][t] = vzero();
    for (int64_t c = q0; c < q0 + gs; c += W, w += q_chunk_bytes<BITS>()) {
      prefetch_ahead<true>(w, q_chunk_bytes<BITS>());
      V x[TT];
      for (int t = 0; t < TT; ++t) x[t] = vload(xs[t] + c);
      VI lanes{}, high{};
      if constexpr (BITS == 4) {
        lanes = load_lanes(w);
        high = isrl(lanes, 16);
      }
      chunk_dot<TT, BITS, MODE>(w, lanes, high, x, acc);
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < TT; ++t) total[r][t] = vfma(acc[r][t], vset1(scale[r]), total[r][t]);
    if constexpr (BITS == 4)
      for (int t = 0; t < TT; ++t) corr[t] = _mm256_fmadd_ps(s8, _mm256_set1_ps(xsums[t][g]), corr[t]);
  }
  // g and u of each (neuron, token), less the zero point's share. int4 row r's sums carry
  // 2^(4r') (see int4_row_value): multiplied out here, exactly (a power of two).
  alignas(32) float zp[TT][R];
  for (int t = 0; t < TT; ++t) _mm256_store_ps(zp[t], _mm256_mul_ps(corr[t], _mm256_set1_ps(zero)));
  float unit[R];
  for (int r = 0; r < R; ++r) unit[r] = BITS == 4 ? kInt4GateUpUnit[MODE] * kInt4RowFactor[r] : 1.0f;
  alignas(64) float gate[W] = {}, up[W] = {}, weight[W] = {}, h[W];
  for (int n = 0; n < NB; ++n)
    for (int t = 0; t < TT; ++t) {
      gate[n * TT + t] = vsum(total[2 * n][t]) * unit[2 * n] - zp[t][2 * n] + (bias ? bias[2 * n] : 0.0f);
      up[n * TT + t] = vsum(total[2 * n + 1][t]) * unit[2 * n + 1] - zp[t][2 * n + 1] + (bias ? bias[2 * n + 1] : 0.0f);
      weight[n * TT + t] = tok_w[t];
    }
  vstore(h, vactivate(act, vload(gate), vload(up), vload(weight)));

  // Down: y += scale_o * sum_n h_n * (q_on - zero): the NB neurons share each output's
  // scale. int4: h_n is multiplied by kInt4NeuronFactor (see there), y is in kInt4DownUnit.
  // kSubnormal's factors (2^84..2^96) would overflow an h_n of 2^32 or more (never seen in a
  // model, but possible): such a group takes the conversion instead, in the same unit.
  const uint8_t* down = w;
  if constexpr (BITS == 4 && MODE == kSubnormal) {
    float largest = 0.0f;
    for (int i = 0; i < NB * TT; ++i) largest = std::max(largest, std::fabs(h[i]));
    if (!(largest < 0x1p32f)) {  // NaN included: either way it propagates
      constexpr float unit = kInt4DownUnit[kSubnormal];
      const float factors[NB] = {unit, unit * 0x1p-4f, unit * 0x1p-8f, unit * 0x1p-12f};
      return down_pass_q<TT, BITS, kConvert>(down, dp, dscale, h, factors, zero * unit, ys);
    }
  }
  const float* factors = BITS == 4 ? kInt4NeuronFactor[MODE] : kUnitFactors;
  down_pass_q<TT, BITS, MODE>(down, dp, dscale, h, factors, zero * (BITS == 4 ? kInt4DownUnit[MODE] : 1.0f), ys);
}

template <int BITS, int MODE>
void group_pass_q_any(int tt, const uint8_t* group, int64_t dp, int64_t gs, int sd, const float* dscale,
                      const float* const* xs, const float* const* xsums, const float* bias, const Activation& act,
                      const float* tok_w, float* const* ys) {
  switch (tt) {
    case 1: return group_pass_q<1, BITS, MODE>(group, dp, gs, sd, dscale, xs, xsums, bias, act, tok_w, ys);
    case 2:
      if constexpr (kMaxTokensPerPassQ >= 2)
        return group_pass_q<2, BITS, MODE>(group, dp, gs, sd, dscale, xs, xsums, bias, act, tok_w, ys);
      break;
  }
}

// The int4 mode this process uses (dm_int4_mode): kSubnormal on AMD, kConvert elsewhere.
// (__builtin_cpu_init: this runs as a constructor, possibly before libgcc's own.)
std::atomic<int> g_int4_mode{[] {
  __builtin_cpu_init();
  return __builtin_cpu_is("amd") ? kSubnormal : kConvert;
}()};

// ----------------------------------------------------------------------------------------
// AMX (Intel's tile multiply, from Sapphire Rapids on): the quantized loops at several tokens.
// With many tokens the AVX-512 loops stop being memory-bound and become bound by fp32
// multiply-adds (one per weight per token); AMX-BF16's TDPBF16PS does a 16x32 by 32x16 bf16
// product into 16x16 fp32 sums, about 30x the multiply-adds per second of AVX-512 on one core
// (Intel Xeon VM, a loop of independent products). It is exact here:
//   - weights: an int4 code less its zero point (-8..7) and an int8 code (-128..127) are
//     exact bf16 values (int4 by a 32-entry vpermw table indexed by the nibble);
//   - activations: an fp32 x is split into three bf16 parts, hi = x truncated to bf16,
//     mid = (x - hi) truncated, lo = x - hi - mid. Each subtraction is exact, and lo has at most
//     8 significant bits, so x = hi + mid + lo exactly (a part below fp32's normal range is
//     flushed to zero by AMX: a relative 2^-126 of nothing the model can tell);
//   - a bf16 x bf16 product is exact in fp32, so three TDPBF16PS (hi, mid, lo against the same
//     weights) give the fp32 dot product up to the order of fp32 summation, as the AVX-512
//     loops do (not their bits: their order differs);
//   - per quantization group the tile's sums are stored and multiplied by the group's scales
//     in fp32, as the AVX-512 loops apply them;
//   - tokens are the tiles' columns and each column's sums are its own: a token gets the same
//     bits whichever other tokens share its tile (the loops at fewer tokens: other bits,
//     within fp32 rounding).
// Weights keep their packed layout (the AVX-512 loops read the same bytes): the codes of 16
// rows x 32 columns are widened to bf16 in vector registers and stored for a tile load.
// The tiles are configured at the start of every job (another library in the process, e.g.
// oneDNN under torch, may have left its own configuration on the calling thread) and
// released at its end. Linux hands a process the tile state only when asked
// (arch_prctl(ARCH_REQ_XCOMP_PERM)): done once at load; without it, or without AMX at build
// time, the AVX-512 loops run. dm_amx_mode switches the path per process (tests run both).
// ----------------------------------------------------------------------------------------

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512VBMI__) && \
    defined(__AVX512BW__)
#define DEAMOE_AMX 1
#endif

// Fewest tokens a projection, and an FFN block (a department's shared part, an expert), take
// the tiles with. A tile product costs the same for 1 token as for 16, the loops one pass per
// 2 tokens: measured on the whole int4 step of bench-lm's shape (Intel Xeon VM, 1 thread,
// the FFN's and the projections' tiles switched apart), projections gained from 2 tokens on,
// blocks lost at 2 and gained from 4 (4 sequences: 0.95x the loops' time, 16: 0.57x).
constexpr int64_t kAmxMinTokens = 2;
constexpr int64_t kAmxMinBlockTokens = 4;
// Tokens per tile: a tile holds 16 rows of 64 bytes.
constexpr int kAmxTokens = 16;

const bool g_amx_available = [] {
#if defined(DEAMOE_AMX)
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}();
// On where available, unless DEAMOE_TRT_CPU_AMX=0 (benchmarks time both paths).
std::atomic<int> g_amx_mode{[] {
  const char* v = std::getenv("DEAMOE_TRT_CPU_AMX");
  return g_amx_available && !(v && std::strcmp(v, "0") == 0) ? 1 : 0;
}()};

#if defined(DEAMOE_AMX)
namespace amx {

struct TileConfig {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles of 16 rows, for products over n <= 16 tokens: weights (tile 5: 16 rows of 32 bf16)
// times activations (tiles 3, 6, 7: 16 column pairs of n tokens, the three parts of x) into
// sums (tiles 0, 1, 2, 4: 16 rows of n tokens). n is the tokens', not 16: the activations,
// which every 16 weight rows read again from L2, are then no bigger than they are. The FFN's
// down projection (down) has the tokens as rows instead: h (tiles 5, 6, 7: n rows of 32 bf16)
// times the codes (tiles 3, 4: 16 neuron pairs of 16 outputs) into sums (tiles 0, 1: n rows
// of 16 outputs); a product's time grows with its rows.
inline void configure(int n, bool down) {
  TileConfig c{};
  c.palette = 1;
  for (int i = 0; i < 8; ++i) c.rows[i] = 16, c.colsb[i] = 64;
  if (down)
    for (int i : {0, 1, 5, 6, 7}) c.rows[i] = static_cast<uint8_t>(n);
  else
    for (int i : {0, 1, 2, 4, 3, 6, 7}) c.colsb[i] = static_cast<uint16_t>(4 * n);
  _tile_loadconfig(&c);
}

// A tile job's configuration: set for n tokens (anew only when it changes), released at the end.
class Tiles {
 public:
  void use(int n, bool down = false) {
    const int key = down ? -n : n;
    if (key != key_) configure(n, down);
    key_ = key;
  }
  ~Tiles() {
    if (key_) _tile_release();
  }

 private:
  int key_ = 0;
};

// bf16(i % 16 - 8) at index i of 32: vpermw reads an index's low 5 bits, of which the int4
// code is the low 4 (the fifth belongs to the next code: both halves are the same table).
inline __m512i int4_table() {
  alignas(64) static const uint16_t table[32] = {0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
                                                 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
                                                 0xC100, 0xC0E0, 0xC0C0, 0xC0A0, 0xC080, 0xC040, 0xC000, 0xBF80,
                                                 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0};
  return _mm512_load_si512(table);
}

// Word indices: the even / odd words of two vectors (64 words), in order.
inline __m512i even_words() {
  alignas(64) static const uint16_t idx[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                               32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
  return _mm512_load_si512(idx);
}
inline __m512i odd_words() { return _mm512_add_epi16(even_words(), _mm512_set1_epi16(1)); }

// x = hi + mid + lo, each part a bf16 value held as an fp32 (its low 16 bits zero).
inline void split3(__m512 x, __m512 (&part)[3]) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  part[0] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), top));
  const __m512 rest = _mm512_sub_ps(x, part[0]);
  part[1] = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(rest), top));
  part[2] = _mm512_sub_ps(rest, part[1]);
}

// The bf16 words of 32 such values a (first 16) and b, in order: their top halves.
inline __m512i bf16_words(__m512 a, __m512 b, __m512i odd) {
  return _mm512_permutex2var_epi16(_mm512_castps_si512(a), odd, _mm512_castps_si512(b));
}

// Activations of T <= 16 tokens as tiles 3, 6, 7 read them: for each chunk of 32 columns kc
// and part p, 16 rows (column pairs 2i, 2i+1) of T dwords (token t: its two bf16 values).
// out: [cols / 32][3][16][T].
inline void build_x(const float* x, int64_t x_stride, int T, int64_t cols, uint32_t* out) {
  const __m512i odd = odd_words();
  const __m512i rows =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(T));
  for (int t = 0; t < T; ++t)
    for (int64_t kc = 0; kc < cols / 32; ++kc) {
      __m512 a[3], b[3];
      split3(_mm512_loadu_ps(x + t * x_stride + 32 * kc), a);
      split3(_mm512_loadu_ps(x + t * x_stride + 32 * kc + 16), b);
      for (int p = 0; p < 3; ++p)
        _mm512_i32scatter_epi32(out + (kc * 3 + p) * 16 * T + t, rows, bf16_words(a[p], b[p], odd), 4);
    }
}

// A row of tile 1 (32 bf16 values, in order) from 32 int8 codes at p and q (16 each).
inline __m512i int8_words(const uint8_t* p, const uint8_t* q) {
  const __m512 a = _mm512_cvtepi32_ps(load_s8(p)), b = _mm512_cvtepi32_ps(load_s8(q));
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));  // a's into the low half
}

// (Macros: GCC's tile intrinsics take the tile's number as a literal.)
// 16 weight rows (tile 5) times the three parts of a column chunk's activations (tiles 3, 6,
// 7), into their sums in tile CT.
#define DEAMOE_GATE_UP_PAIR(CT) \
  do {                          \
    _tile_dpbf16ps(CT, 5, 3);   \
    _tile_dpbf16ps(CT, 5, 6);   \
    _tile_dpbf16ps(CT, 5, 7);   \
  } while (0)

// Up to 4 sets of 16 weight rows times T tokens' activations (xb, as build_x lays them out),
// quantization group by quantization group (groups of kcs column chunks each). Step
// kc * sets + set's rows are in a[step % 2], built by build(step) one step ahead, so the
// decoding overlaps the products. Per group: scales(q) before its products, its sums (set s
// in sums[s]) stored, then collect(q) scales them into the caller's totals.
template <class Build, class Scales, class Collect>
inline void group_sums(const uint32_t* xb, int T, int64_t groups, int64_t kcs, int sets, uint16_t (&a)[2][16][32],
                       float (&sums)[4][16][16], Build&& build, Scales&& scales, Collect&& collect) {
  const int64_t steps = groups * kcs * sets;
  build(0);
  for (int64_t q = 0; q < groups; ++q) {
    scales(q);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(4);
    for (int64_t kc = q * kcs; kc < (q + 1) * kcs; ++kc) {
      const uint32_t* x = xb + kc * 3 * 16 * T;
      _tile_loadd(3, x, 4 * T);
      _tile_loadd(6, x + 16 * T, 4 * T);
      _tile_loadd(7, x + 32 * T, 4 * T);
      for (int set = 0; set < sets; ++set) {
        const int64_t step = kc * sets + set;
        if (step + 1 < steps) build(step + 1);
        _tile_loadd(5, a[step % 2], 64);
        if (set == 0) DEAMOE_GATE_UP_PAIR(0);
        if (set == 1) DEAMOE_GATE_UP_PAIR(1);
        if (set == 2) DEAMOE_GATE_UP_PAIR(2);
        if (set == 3) DEAMOE_GATE_UP_PAIR(4);
      }
    }
    _tile_stored(0, sums[0], 64);
    if (sets > 1) _tile_stored(1, sums[1], 64);
    if (sets > 2) _tile_stored(2, sums[2], 64);
    if (sets > 3) _tile_stored(4, sums[3], 64);
    collect(q);
  }
}

}  // namespace amx
#endif

// ----------------------------------------------------------------------------------------
// Thread pool: the calling thread is thread 0, n-1 workers. A worker spins briefly after a
// job (the next one often follows at once: the next layer), then sleeps on a futex
// (std::atomic::wait), so an idle pool costs nothing and leaves the cores to others. wake()
// lets a caller start the workers' wake-up (tens of microseconds in a VM) while it computes
// something else, e.g. the routing; a woken worker spins longer, expecting the job.
// ----------------------------------------------------------------------------------------

using JobFn = void (*)(void* ctx, int tid, int nthreads);
using Clock = std::chrono::steady_clock;

inline void cpu_relax() { _mm_pause(); }

class Pool {
 public:
  Pool(int threads, int spin_after_job_us, int spin_after_wake_us)
      : n_(std::max(1, threads)),
        spin_after_job_(std::chrono::microseconds(std::max(0, spin_after_job_us))),
        spin_after_wake_(std::chrono::microseconds(std::max(0, spin_after_wake_us))) {
    cpu_set_t allowed;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &allowed)) cpus_.push_back(c);
    // More threads than cores: they take turns, so they must yield rather than spin.
    oversubscribed_ = n_ > static_cast<int>(std::max<size_t>(cpus_.size(), 1));
    pin_ = !oversubscribed_ && n_ > 1 && !getenv_false("DEAMOE_TRT_CPU_PIN");
    worker_cpu_.assign(static_cast<size_t>(n_), -1);
    for (int t = 1; t < n_; ++t) workers_.emplace_back([this, t] { worker(t); });
  }
  ~Pool() {
    stop_.store(true);
    signal_.fetch_add(1);
    signal_.notify_all();
    for (auto& w : workers_) w.join();
  }
  int size() const { return n_; }

  void wake() {
    place_workers();
    signal_.fetch_add(1);
    if (sleepers_.load() > 0) signal_.notify_all();
  }

  // Run fn(ctx, t, n) on every thread t, return when all have finished. One job at a time:
  // ctypes releases the GIL, so two Python threads may call in together.
  void run(JobFn fn, void* ctx) {
    std::lock_guard<std::mutex> lock(run_mutex_);
    if (n_ == 1) return fn(ctx, 0, 1);
    fn_ = fn;
    ctx_ = ctx;
    remaining_.store(n_ - 1);
    job_.fetch_add(1);  // seq_cst: publishes fn_/ctx_ before workers see the new job
    wake();
    fn(ctx, 0, n_);
    // Wait for the workers: spin briefly (the split is balanced, they are about done), then
    // yield the core, in case a worker shares it.
    const auto spin_until = Clock::now() + std::chrono::microseconds(20);
    while (remaining_.load(std::memory_order_acquire) != 0) {
      if (Clock::now() < spin_until && !oversubscribed_)
        cpu_relax();
      else
        std::this_thread::yield();
    }
  }

  // Run fn(ctx, k, slices) for every slice k in [0, slices), each exactly once, on whichever
  // thread claims it first; return when all have finished. The calling thread starts at once
  // and does not wait for a worker that is still waking up: it takes the slices that worker
  // would have run. What a slice computes must not depend on the thread running it.
  void run_slices(JobFn fn, void* ctx, int slices) {
    std::lock_guard<std::mutex> lock(run_mutex_);
    if (n_ == 1 || slices <= 1) {
      for (int k = 0; k < slices; ++k) fn(ctx, k, slices);
      return;
    }
    slice_fn_ = fn;
    slice_ctx_ = ctx;
    done_.store(0, std::memory_order_relaxed);
    const uint32_t job = job_.load() + 1;  // run_mutex_ is held: the next job's number
    // release: publishes slice_fn_/slice_ctx_/done_ to whoever claims a slice of this job
    claim_.store(uint64_t{job} << 32 | uint64_t(slices) << 16, std::memory_order_release);
    job_.fetch_add(1);
    wake();
    claim();
    const auto spin_until = Clock::now() + std::chrono::microseconds(20);
    while (done_.load(std::memory_order_acquire) != slices) {
      if (Clock::now() < spin_until && !oversubscribed_)
        cpu_relax();
      else
        std::this_thread::yield();
    }
  }

 private:
  // Claim and run slices of the current sliced job until none is left. claim_ packs the job's
  // number (bits 32-63), its slice count (16-31) and the next unclaimed slice (0-15), so a
  // thread that arrives late, even after that job has ended and another begun, claims a
  // slice of exactly one job and reads that job's fn and ctx, which stay put until every
  // slice of it, its own included, is done. Returns the job number of the last word seen.
  uint32_t claim() {
    for (;;) {
      const uint64_t c = claim_.fetch_add(1, std::memory_order_acq_rel);
      const int slices = static_cast<int>((c >> 16) & 0xffff), k = static_cast<int>(c & 0xffff);
      if (k >= slices) return static_cast<uint32_t>(c >> 32);
      slice_fn_(slice_ctx_, k, slices);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void worker(int tid) {
    // Jobs are counted from 0, not from what job_ holds when this thread gets going: a
    // run() may already have been issued by then, and it must not be missed.
    uint32_t seen = 0;
    uint32_t signal = 0;
    auto deadline = Clock::now() + spin_after_wake_;
    for (;;) {
      const uint32_t job = job_.load();
      if (job != seen) {
        seen = job;
        // The wake-up calls that came with this job are answered by running it: they must
        // not make this thread spin on afterwards.
        signal = signal_.load();
        // A sliced job numbered `job` or later: claim its slices (none may be left). A job
        // run() issued: claim_ still holds an earlier, finished sliced job, and run() waits
        // for this thread, so `job` is still the current one.
        if (static_cast<int32_t>(claim() - job) < 0) {
          fn_(ctx_, tid, n_);
          remaining_.fetch_sub(1, std::memory_order_release);
        }
        deadline = Clock::now() + spin_after_job_;
        continue;
      }
      if (stop_.load()) return;
      const uint32_t s = signal_.load();
      if (s != signal) {  // a wake-up call: a job is coming, spin for it
        signal = s;
        deadline = std::max(deadline, Clock::now() + spin_after_wake_);
      }
      if (Clock::now() < deadline) {
        if (oversubscribed_)
          std::this_thread::yield();
        else
          cpu_relax();
        continue;
      }
      // Sleep until the next wake()/run(). s was read before job_ is rechecked: a run() in
      // between has changed signal_ by the time we wait, so wait() returns at once.
      sleepers_.fetch_add(1);
      if (job_.load() == seen && !stop_.load()) signal_.wait(s);
      sleepers_.fetch_sub(1);
    }
  }

  // Keep each worker on a core other than the caller's. Measured on a 2-vCPU VM: a worker
  // woken after an idle spell was often placed on the caller's core (a guest scheduler
  // avoids a vCPU its host has descheduled), and the two then took turns on one core: a
  // trivial step took 2.4 ms instead of 30 us, a real one ran at one core's bandwidth. The
  // caller is not pinned (its affinity is inherited by every thread it creates later); the
  // workers follow it, re-pinned only when it has moved. DEAMOE_TRT_CPU_PIN=0 turns this off.
  void place_workers() {
    if (!pin_) return;
    std::lock_guard<std::mutex> lock(place_mutex_);
    const int here = sched_getcpu();
    size_t next = 0;
    for (int t = 1; t < n_; ++t) {
      if (cpus_[next % cpus_.size()] == here) ++next;
      const int cpu = cpus_[next++ % cpus_.size()];
      if (worker_cpu_[t] == cpu) continue;
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (pthread_setaffinity_np(workers_[t - 1].native_handle(), sizeof(set), &set) == 0) worker_cpu_[t] = cpu;
    }
  }

  static bool getenv_false(const char* name) {
    const char* v = std::getenv(name);
    return v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "no") == 0);
  }

  const int n_;
  std::vector<int> cpus_;
  std::vector<int> worker_cpu_;
  bool oversubscribed_ = false;
  bool pin_ = false;
  std::mutex place_mutex_;
  const Clock::duration spin_after_job_;
  const Clock::duration spin_after_wake_;
  std::vector<std::thread> workers_;
  std::atomic<uint32_t> job_{0};
  std::atomic<uint32_t> signal_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> remaining_{0};
  std::atomic<bool> stop_{false};
  std::mutex run_mutex_;
  JobFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> done_{0};
  JobFn slice_fn_ = nullptr;
  void* slice_ctx_ = nullptr;
};

// Slices of a MoE step (see run_slices). Not a function of the token count: a token's output
// must not depend on which other tokens share its step (tests/cpu holds the kernel to
// that), and the slice boundaries set the order its sums are taken in. The same on 1 and 2
// threads (the same bits); 2 per thread from 4 threads up, so all threads get a share.
// More slices leave the caller less time waiting for the last one, but cut every block into
// more streams and cost more partial outputs: on the qwen3 int4 layer, 1 token, 2 threads,
// 4 per block beat 6 and 8 (docs/benchmarks.md). run_slices counts them in 16 bits.
constexpr int kStepSlices = 4;
int step_slices(int threads) { return std::max(kStepSlices, 2 * threads); }

// Static, balanced split of [0, total) into n ranges: thread t gets [begin, end).
inline void split(int64_t total, int t, int n, int64_t* begin, int64_t* end) {
  *begin = total * t / n;
  *end = total * (t + 1) / n;
}

// ----------------------------------------------------------------------------------------
// The MoE step.
// ----------------------------------------------------------------------------------------

// One block to run this step: a packed weight block and the tokens that use it.
struct Task {
  const void* weights;
  int64_t groups;     // neuron groups in the block
  int64_t tok_begin;  // into Step::tok_idx / tok_w
  int64_t tok_count;
  const float* gate_up_bias = nullptr;  // [groups, R] (row order), or null
  const float* down_bias = nullptr;     // [dp], or null
};

struct Step {
  int dtype;  // 0 fp32, 1 fp16
  int bits;   // 0: float weights of dtype; 4 or 8: quantized (group_pass_q)
  int64_t group_size;
  int scale_dtype;  // quantized: ScaleDtype
  int64_t dp;
  int64_t tokens;
  const float* x;  // [tokens, dp], zero-padded
  std::vector<Task> tasks;
  std::vector<int64_t> tok_idx;
  std::vector<float> tok_w;
  std::vector<float> xsum;  // int4: [tokens, dp / group_size], each group's sum of x (its zero point's share)
  int int4_mode = kConvert;
  std::vector<float> x_shifted;  // int4 kSubnormal: x * 2^kSubnormalXShift, [tokens, dp]
  float* partial;                // [slices, tokens, dp]
  Activation act{0, 1.0f, 0.0f};
  bool amx = false;          // quantized blocks of kAmxMinBlockTokens or more tokens take the tiles
  std::vector<uint32_t> xb;  // then: every token's x as the tiles read it (amx::build_x)
};

// y_t += w_t * b * unit for the task's tokens, from the one slice whose share of the block
// starts at its first group (split gives slice 0 group 0; a later slice starts there only
// while the earlier ones are empty), so the bias is added once whatever the slice count.
inline void add_down_bias(const Step& s, const Task& task, int64_t g0, int64_t g1, float* mine, float unit) {
  if (!task.down_bias || g0 != 0 || g1 == 0) return;
  for (int64_t i = 0; i < task.tok_count; ++i) {
    float* y = mine + s.tok_idx[task.tok_begin + i] * s.dp;
    const V w = vset1(s.tok_w[task.tok_begin + i] * unit);
    for (int64_t c = 0; c < s.dp; c += W) vstore(y + c, vfma(w, vload(task.down_bias + c), vload(y + c)));
  }
}

// A block's rows of down scales as fp32: a row stored in 16 bits is widened once, when a
// thread's job first reads it, for every neuron group (or tile chunk) that reads it next.
class DownScales {
 public:
  const float* row(const uint8_t* row, int sd, int64_t dp) {
    if (sd == kScaleF32) return reinterpret_cast<const float*>(row);
    if (row != row_) {
      if (static_cast<int64_t>(widened_.size()) < dp) widened_.resize(static_cast<size_t>(dp));
      for (int64_t c = 0; c < dp; c += 8) _mm256_storeu_ps(widened_.data() + c, load_scales8(row + 2 * c, sd));
      row_ = row;
    }
    return widened_.data();
  }
  // A job's rows may sit where an earlier job's were, holding other scales: widen anew.
  void forget() { row_ = nullptr; }

 private:
  std::vector<float> widened_;
  const uint8_t* row_ = nullptr;
};

// Slice `slice` of `slices`: the same share of every block's groups, into its own partial.
template <typename WT>
void run_tasks(const Step& s, int slice, int slices) {
  const int64_t dp = s.dp;
  float* mine = s.partial + slice * s.tokens * dp;
  std::fill(mine, mine + s.tokens * dp, 0.0f);
  const int64_t group_elems = 3 * NB * dp;
  const float* xs[kMaxTokensPerPass];
  float* ys[kMaxTokensPerPass];
  for (const Task& task : s.tasks) {
    int64_t g0, g1;
    split(task.groups, slice, slices, &g0, &g1);
    const WT* base = static_cast<const WT*>(task.weights);
    for (int64_t t0 = 0; t0 < task.tok_count; t0 += kMaxTokensPerPass) {
      const int tt = static_cast<int>(std::min<int64_t>(kMaxTokensPerPass, task.tok_count - t0));
      for (int t = 0; t < tt; ++t) {
        const int64_t token = s.tok_idx[task.tok_begin + t0 + t];
        xs[t] = s.x + token * dp;
        ys[t] = mine + token * dp;
      }
      const float* w = s.tok_w.data() + task.tok_begin + t0;
      for (int64_t g = g0; g < g1; ++g) {
        const float* bias = task.gate_up_bias ? task.gate_up_bias + g * R : nullptr;
        group_pass_any<WT>(tt, base + g * group_elems, dp, xs, bias, s.act, w, ys);
      }
    }
    add_down_bias(s, task, g0, g1, mine, 1.0f);
  }
}

#if defined(DEAMOE_AMX)
// Row i of tile 2's 32 bf16 values from column chunk pair w (2 * q_chunk_bytes<BITS>): the
// 8 rows of a neuron group into a[0..7].
template <int BITS>
inline void gate_up_rows(const uint8_t* w, uint16_t (*a)[32], __m512i table, __m512i even, __m512i odd) {
  if constexpr (BITS == 4) {
    // Lane c: column c's 8 rows; shifted by 4r, its low word holds row r's code and its high
    // word row r + 4's: the even and odd words of the two chunks, in order.
    const __m512i l0 = _mm512_loadu_si512(w), l1 = _mm512_loadu_si512(w + 64);
    for (int r = 0; r < 4; ++r) {
      const __m512i s0 = _mm512_srli_epi32(l0, 4 * r), s1 = _mm512_srli_epi32(l1, 4 * r);
      _mm512_store_si512(a[r], _mm512_permutexvar_epi16(_mm512_permutex2var_epi16(s0, even, s1), table));
      _mm512_store_si512(a[r + 4], _mm512_permutexvar_epi16(_mm512_permutex2var_epi16(s0, odd, s1), table));
    }
  } else {
    for (int r = 0; r < R; ++r) _mm512_store_si512(a[r], amx::int8_words(w + r * W, w + q_chunk_bytes<8>() + r * W));
  }
}

// (Macros: GCC's tile intrinsics take the tile's number as a literal.)
// One chunk of 16 outputs: its 32 neurons' codes (tile BT, from b) times the three parts of h
// (tiles 5-7), into the sums in tile CT.
#define DEAMOE_DOWN_CHUNK(CT, BT, b) \
  do {                               \
    _tile_loadd(BT, b, 64);          \
    _tile_zero(CT);                  \
    _tile_dpbf16ps(CT, 5, BT);       \
    _tile_dpbf16ps(CT, 6, BT);       \
    _tile_dpbf16ps(CT, 7, BT);       \
  } while (0)

// A quantized block's groups [g0, g1) for the task's T <= 16 tokens on the tiles (see "AMX"
// above). Gate/up: two neuron groups at a time, their 16 rows (the first group's 8, then the
// second's) the weight tile against the tokens' activations, sums 16 rows x 16 tokens; per
// quantization group the sums are scaled into `total` (row, token lanes), and the activation
// runs on those vectors, all tokens at once. Down: up to 8 neuron groups (32 neurons, one
// row of down scales) at a time, h (T tokens x 32, in three parts) against the 32 neurons'
// codes of 16 outputs, sums T tokens x 16 outputs, times the outputs' scales into y.
// Pipelined, because a tile load waits for the vector stores of its bytes to complete, a tile
// store for the products into its tile, and vector loads for that store: the codes of the
// next chunk are widened (into the other of two buffers) before this chunk's are loaded, a
// tile's sums are stored once the next tile's products are issued, and read back one step
// later. Without it the int4 layer at 16 tokens ran 4x slower (profile: the loads waiting).
// xb: the tokens' activations as tiles 3, 6, 7 read them (amx::build_x); unit: the partials'
// (kInt4DownUnit); ys: the tokens' partial outputs.
template <int BITS>
void amx_ffn_task(const Step& s, const Task& task, int64_t g0, int64_t g1, const uint32_t* xb, int T, float unit,
                  float* const* ys, amx::Tiles& tiles, DownScales& down_scales) {
  const int64_t dp = s.dp, gs = s.group_size;
  const int sd = s.scale_dtype, sbytes = scale_bytes(sd);
  const int64_t group_bytes = q_group_bytes(BITS, gs, dp, sd), scale_area = q_scale_area_bytes(gs, dp, sd);
  const int64_t gate_up = q_gate_up_bytes(BITS, gs, dp, sd);
  const auto* base = static_cast<const uint8_t*>(task.weights);
  const __m512i table = amx::int4_table(), even = amx::even_words(), odd = amx::odd_words();
  // int8 down: the words of two neurons' outputs (16 each) interleaved, output by output.
  alignas(64) static const uint16_t pair_idx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i pairs = _mm512_load_si512(pair_idx);
  const __mmask16 live = static_cast<__mmask16>((1u << T) - 1);
  const V tok_w = _mm512_maskz_loadu_ps(live, s.tok_w.data() + task.tok_begin);
  alignas(64) uint16_t a[2][16][32];        // weights, in turn
  alignas(64) float sums[4][16][16] = {};   // stored sums
  alignas(64) float hT[16][32];             // h, token x neuron
  alignas(64) uint16_t hp[3][16][32] = {};  // its parts; tokens from T on stay 0
  alignas(64) uint16_t bd[2][16][32];       // down codes, in turn
  alignas(32) float scale[8][8];            // per group of the chunk, its rows' scales
  alignas(64) float total[8][8][16];        // per group, row, token: the scaled sums
  const int64_t per_scale = gs / NB;        // neuron groups per row of down scales
  const int64_t kcs = gs / 32;              // chunks of 32 columns per quantization group
  for (int64_t g = g0; g < g1;) {
    const int64_t ge = std::min({g + 8, g1, (g / per_scale + 1) * per_scale});
    std::memset(hT, 0, sizeof hT);
    // Gate/up, column chunk by column chunk: the chunk's activations are loaded once (tiles 3,
    // 6, 7) for every pair of groups, each pair's sums in its own tile (0, 1, 2, 4).
    const int ng = static_cast<int>(ge - g), np = (ng + 1) / 2;
    tiles.use(T);
    // The next chunk's groups: their scales and first codes (this chunk's codes are asked for
    // kPrefetchBytes ahead, as in group_pass_q, but its scales and first codes would not be).
    for (int64_t next = ge; next < std::min(ge + 8, g1); ++next)
      for (int64_t b = 0; b < scale_area + kPrefetchBytes; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(base + next * group_bytes + b), _MM_HINT_T1);
    if (ng % 2) std::memset(a[0][8], 0, 8 * sizeof a[0][0]), std::memset(a[1][8], 0, 8 * sizeof a[1][0]);
    const uint8_t* grp = base + g * group_bytes;
    auto build_rows = [&](int64_t step) {  // step = kc * np + pair: its codes into a[step % 2]
      const int64_t kc = step / np, p = step % np;
      for (int i = 0; i < 2 && 2 * p + i < ng; ++i) {
        const uint8_t* w = grp + (2 * p + i) * group_bytes + scale_area + kc * 2 * q_chunk_bytes<BITS>();
        prefetch_ahead<true>(w, 2 * q_chunk_bytes<BITS>());
        gate_up_rows<BITS>(w, a[step % 2] + 8 * i, table, even, odd);
      }
    };
    amx::group_sums(
        xb, T, dp / gs, kcs, np, a, sums, build_rows,
        [&](int64_t q) {
          for (int i = 0; i < ng; ++i)
            _mm256_store_ps(scale[i], load_scales8(grp + i * group_bytes + q * R * sbytes, sd));
        },
        [&](int64_t q) {
          for (int p = 0; p < np; ++p)
            for (int m = 0; m < 16 && 8 * p + m < 8 * ng; ++m) {
              float* tot = total[2 * p + m / 8][m % 8];
              _mm512_store_ps(tot, vfma(_mm512_load_ps(sums[p][m]), vset1(scale[2 * p + m / 8][m % 8]),
                                        q ? _mm512_load_ps(tot) : vzero()));
            }
        });
    for (int i = 0; i < ng; ++i) {
      const float* bias = task.gate_up_bias ? task.gate_up_bias + (g + i) * R : nullptr;
      for (int n = 0; n < NB; ++n) {
        const V gate = vadd(_mm512_load_ps(total[i][2 * n]), vset1(bias ? bias[2 * n] : 0.0f));
        const V up = vadd(_mm512_load_ps(total[i][2 * n + 1]), vset1(bias ? bias[2 * n + 1] : 0.0f));
        alignas(64) float h[16];
        vstore(h, vactivate(s.act, gate, up, tok_w));
        for (int t = 0; t < T; ++t) hT[t][i * NB + n] = h[t];
      }
    }
    for (int t = 0; t < T; ++t) {
      __m512 lo[3], hi[3];
      amx::split3(_mm512_load_ps(hT[t]), lo);
      amx::split3(_mm512_load_ps(hT[t] + 16), hi);
      for (int p = 0; p < 3; ++p) _mm512_store_si512(hp[p][t], amx::bf16_words(lo[p], hi[p], odd));
    }
    tiles.use(T, true);
    _tile_loadd(5, hp[0], 64);
    _tile_loadd(6, hp[1], 64);
    _tile_loadd(7, hp[2], 64);
    if (ng < 8)
      std::memset(bd[0][2 * ng], 0, (16 - 2 * ng) * sizeof bd[0][0]),
          std::memset(bd[1][2 * ng], 0, (16 - 2 * ng) * sizeof bd[0][0]);
    // This chunk's row of down scales.
    const float* dscale = down_scales.row(base + task.groups * group_bytes + g / per_scale * dp * sbytes, sd, dp);
    const V vunit = vset1(unit);
    auto build = [&](int64_t j) {  // output chunk j's codes into bd[j % 2]
      uint16_t (*b)[32] = bd[j % 2];
      for (int i = 0; i < ng; ++i) {
        const uint8_t* w = base + (g + i) * group_bytes + gate_up + j * (BITS == 4 ? 2 * W : NB * W);
        prefetch_ahead<true>(w, BITS == 4 ? 2 * W : NB * W);
        if constexpr (BITS == 4) {
          // Lane o: output o's 4 neuron codes. z | z << 12 puts neuron 1's code in the high word,
          // shifted by 8 neurons 2 and 3 come down to the low nibbles of the two words.
          const __m512i z = load_u16(w), v = _mm512_or_si512(z, _mm512_slli_epi32(z, 12));
          _mm512_store_si512(b[2 * i], _mm512_permutexvar_epi16(v, table));
          _mm512_store_si512(b[2 * i + 1], _mm512_permutexvar_epi16(_mm512_srli_epi32(v, 8), table));
        } else {
          for (int n = 0; n < NB; n += 2)
            _mm512_store_si512(b[2 * i + n / 2],
                               _mm512_permutexvar_epi16(pairs, amx::int8_words(w + n * W, w + (n + 1) * W)));
        }
      }
    };
    auto store = [&](int64_t j) {  // output chunk j's sums, from tile j % 2
      if (j % 2 == 0)
        _tile_stored(0, sums[0], 64);
      else
        _tile_stored(1, sums[1], 64);
    };
    auto added = [&](int64_t j) {  // ... stored, times the outputs' scales, into y
      const V sc = vmul(vload(dscale + j * W), vunit);
      for (int t = 0; t < T; ++t) vstore(ys[t] + j * W, vfma(_mm512_load_ps(sums[j % 2][t]), sc, vload(ys[t] + j * W)));
    };
    const int64_t outs = dp / W;
    build(0);
    for (int64_t j = 0; j < outs; ++j) {
      if (j + 1 < outs) build(j + 1);
      if (j % 2 == 0)
        DEAMOE_DOWN_CHUNK(0, 3, bd[0]);
      else
        DEAMOE_DOWN_CHUNK(1, 4, bd[1]);
      if (j >= 1) store(j - 1);
      if (j >= 2) added(j - 2);
    }
    store(outs - 1);
    if (outs >= 2) added(outs - 2);
    added(outs - 1);
    g = ge;
  }
}

// A task on the tiles: its tokens' columns of the step's activations (all of them in order
// as they are, else gathered), then its groups.
template <int BITS, int MODE>
void amx_task(const Step& s, const Task& task, int64_t g0, int64_t g1, float* mine, amx::Tiles& tiles,
              DownScales& down_scales) {
  const int T = static_cast<int>(task.tok_count);
  alignas(64) int32_t idx[16] = {};
  float* ys[16];
  bool in_order = task.tok_count == s.tokens;
  for (int t = 0; t < T; ++t) {
    idx[t] = static_cast<int32_t>(s.tok_idx[task.tok_begin + t]);
    in_order = in_order && idx[t] == t;
    ys[t] = mine + idx[t] * s.dp;
  }
  const uint32_t* xb = s.xb.data();
  thread_local std::vector<uint32_t> gathered;
  if (!in_order) {  // row by row (s.tokens dwords each: s.xb has room for a vector past the last)
    const int64_t rows = s.dp / 32 * 3 * 16;
    gathered.resize(static_cast<size_t>(rows * T));
    const __m512i pick = _mm512_load_si512(idx);
    const __mmask16 live = static_cast<__mmask16>((1u << T) - 1);
    uint32_t* out = gathered.data();
    for (int64_t r = 0; r < rows; ++r)
      _mm512_mask_storeu_epi32(out + r * T, live,
                               _mm512_permutexvar_epi32(pick, _mm512_loadu_si512(xb + r * s.tokens)));
    xb = out;
  }
  amx_ffn_task<BITS>(s, task, g0, g1, xb, T, BITS == 4 ? kInt4DownUnit[MODE] : 1.0f, ys, tiles, down_scales);
}
#endif

template <int BITS, int MODE>
void run_tasks_q(const Step& s, int slice, int slices) {
  const int64_t dp = s.dp, gs = s.group_size;
  float* mine = s.partial + slice * s.tokens * dp;
  std::fill(mine, mine + s.tokens * dp, 0.0f);
  const int sd = s.scale_dtype;
  const int64_t group_bytes = q_group_bytes(BITS, gs, dp, sd), row_bytes = dp * scale_bytes(sd);
  const float* xs[kMaxTokensPerPassQ];
  const float* xsums[kMaxTokensPerPassQ];
  float* ys[kMaxTokensPerPassQ];
  thread_local DownScales down_scales;  // its buffer kept from job to job
  down_scales.forget();
#if defined(DEAMOE_AMX)
  amx::Tiles tiles;
#endif
  for (const Task& task : s.tasks) {
    int64_t g0, g1;
    split(task.groups, slice, slices, &g0, &g1);
    const auto* base = static_cast<const uint8_t*>(task.weights);
    const uint8_t* dscales = base + task.groups * group_bytes;
#if defined(DEAMOE_AMX)
    if (s.amx && task.tok_count >= kAmxMinBlockTokens) {
      if (g0 < g1) amx_task<BITS, MODE>(s, task, g0, g1, mine, tiles, down_scales);
      add_down_bias(s, task, g0, g1, mine, BITS == 4 ? kInt4DownUnit[MODE] : 1.0f);
      continue;
    }
#endif
    for (int64_t t0 = 0; t0 < task.tok_count; t0 += kMaxTokensPerPassQ) {
      const int tt = static_cast<int>(std::min<int64_t>(kMaxTokensPerPassQ, task.tok_count - t0));
      for (int t = 0; t < tt; ++t) {
        const int64_t token = s.tok_idx[task.tok_begin + t0 + t];
        xs[t] = (MODE == kSubnormal ? s.x_shifted.data() : s.x) + token * dp;
        xsums[t] = BITS == 4 ? s.xsum.data() + token * (dp / gs) : nullptr;
        ys[t] = mine + token * dp;
      }
      const float* w = s.tok_w.data() + task.tok_begin + t0;
      for (int64_t g = g0; g < g1; ++g) {
        const float* bias = task.gate_up_bias ? task.gate_up_bias + g * R : nullptr;
        const float* dscale = down_scales.row(dscales + g * NB / gs * row_bytes, sd, dp);
        group_pass_q_any<BITS, MODE>(tt, base + g * group_bytes, dp, gs, sd, dscale, xs, xsums, bias, s.act, w, ys);
      }
    }
    // The partial outputs of int4 steps are in kInt4DownUnit (see there).
    add_down_bias(s, task, g0, g1, mine, BITS == 4 ? kInt4DownUnit[MODE] : 1.0f);
  }
}

void step_job(void* ctx, int slice, int slices) {
  const Step& s = *static_cast<const Step*>(ctx);
  if (s.bits == 4 && s.int4_mode == kSubnormal)
    run_tasks_q<4, kSubnormal>(s, slice, slices);
  else if (s.bits == 4)
    run_tasks_q<4, kConvert>(s, slice, slices);
  else if (s.bits == 8)
    run_tasks_q<8, kConvert>(s, slice, slices);
  else if (s.dtype == 1)
    run_tasks<uint16_t>(s, slice, slices);
  else
    run_tasks<float>(s, slice, slices);
}

struct RouterJob {
  int dtype;
  const void* w;  // [rows, dp]
  int64_t rows, dp, tokens;
  const float* x;  // [tokens, dp]
  float* out;      // [tokens, rows]
};

template <typename WT>
void router_rows(const RouterJob& r, int tid, int nthreads) {
  int64_t r0, r1;
  split(r.rows, tid, nthreads, &r0, &r1);
  const WT* w = static_cast<const WT*>(r.w);
  const float* xs[kRouterTokensPerPass];
  float res[kRouterTokensPerPass];
  for (int64_t t0 = 0; t0 < r.tokens; t0 += kRouterTokensPerPass) {
    const int tt = static_cast<int>(std::min<int64_t>(kRouterTokensPerPass, r.tokens - t0));
    for (int t = 0; t < tt; ++t) xs[t] = r.x + (t0 + t) * r.dp;
    for (int64_t row = r0; row < r1; ++row) {
      dot_rows_any<WT>(tt, w + row * r.dp, xs, r.dp, res);
      for (int t = 0; t < tt; ++t) r.out[(t0 + t) * r.rows + row] = res[t];
    }
  }
}

void router_job(void* ctx, int tid, int nthreads) {
  const RouterJob& r = *static_cast<const RouterJob*>(ctx);
  if (r.dtype == 1)
    router_rows<uint16_t>(r, tid, nthreads);
  else
    router_rows<float>(r, tid, nthreads);
}

struct StreamJob {
  const float* buf;
  int64_t n;  // floats, a multiple of 4 * W * threads
  double* sums;
};

// The roof: how fast this machine streams a buffer much larger than its caches with the
// same threads and the same access pattern (one contiguous range per thread) as the MoE step.
void stream_job(void* ctx, int tid, int nthreads) {
  const StreamJob& j = *static_cast<const StreamJob*>(ctx);
  int64_t b, e;
  split(j.n / (4 * W), tid, nthreads, &b, &e);
  V a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
  for (const float* p = j.buf + b * 4 * W; p < j.buf + e * 4 * W; p += 4 * W) {
    a0 = vadd(a0, vload(p));
    a1 = vadd(a1, vload(p + W));
    a2 = vadd(a2, vload(p + 2 * W));
    a3 = vadd(a3, vload(p + 3 * W));
  }
  j.sums[tid] = vsum(vadd(vadd(a0, a1), vadd(a2, a3)));
}

struct BusyJob {
  Clock::time_point until;
};

void busy_job(void* ctx, int, int) {
  const auto until = static_cast<const BusyJob*>(ctx)->until;
  while (Clock::now() < until) cpu_relax();
}

}  // namespace

// ------------------------------------------------------------------------------------------
// C ABI. Pointers to weights must stay valid while used; the caller (Python) owns them.
// Functions returning int return 0 on success, a negative code on bad arguments.
// ------------------------------------------------------------------------------------------

extern "C" {

int dm_abi_version() { return 12; }
// The int4 code-to-float mode (see kConvert / kSubnormal): set it with 0 or 1 (tests run
// both), pass -1 to only read it. Returns the mode in force.
int dm_int4_mode(int mode) {
  if (mode == kConvert || mode == kSubnormal) g_int4_mode.store(mode);
  return g_int4_mode.load();
}
// The AMX path (see "AMX"): 1 on (only where the build and the OS allow it), 0 off; -1 only
// reads it. Returns the mode in force.
int dm_amx_mode(int mode) {
  if (mode == 0 || (mode == 1 && g_amx_available)) g_amx_mode.store(mode);
  return g_amx_mode.load();
}
// Whether the build and the OS allow the AMX path (dm_amx_mode can turn it on).
int dm_amx_available() { return g_amx_available ? 1 : 0; }
const char* dm_simd() { return DEAMOE_SIMD; }
int64_t dm_row_pad() { return kPad; }
int64_t dm_neurons_per_group() { return NB; }

void* dm_pool_create(int threads, int spin_after_job_us, int spin_after_wake_us) {
  try {
    return new Pool(threads, spin_after_job_us, spin_after_wake_us);
  } catch (...) {
    return nullptr;
  }
}
void dm_pool_destroy(void* pool) { delete static_cast<Pool*>(pool); }
int dm_pool_size(void* pool) { return static_cast<Pool*>(pool)->size(); }
void dm_pool_wake(void* pool) { static_cast<Pool*>(pool)->wake(); }
// Slices a MoE step is cut into on this pool: a step's scratch holds slices * tokens * dp floats.
int dm_step_slices(void* pool) { return step_slices(static_cast<Pool*>(pool)->size()); }

// Weight memory: 2 MiB aligned and advised as transparent huge pages, so streaming a
// gigabyte of weights does not also walk a page table entry every 4 KiB. Fresh pages from
// the kernel (mmap), advised before anything touches them: memory from the C heap that
// earlier allocations had already faulted in stays in 4 KiB pages whatever the advice. On
// the AMD EPYC VM most of bench-lm's int4 model had come out that way (one block's experts
// in huge pages, the other's not, none of the projections), differently from one process
// to the next; the whole int4 step ran 1.25x faster, median of 16 alternating processes.
constexpr size_t kHugePage = size_t(2) << 20;
inline size_t huge_pages_of(int64_t bytes) {
  return (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + kHugePage - 1) / kHugePage * kHugePage;
}

void* dm_alloc(int64_t bytes) {
  const size_t size = huge_pages_of(bytes);
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  // Keep the 2 MiB-aligned run of `size` bytes, give back the rest.
  auto* const first = static_cast<char*>(raw);
  auto* const start =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(first) + kHugePage - 1) / kHugePage * kHugePage);
  if (start > first) munmap(first, static_cast<size_t>(start - first));
  const size_t tail = static_cast<size_t>(first + size + kHugePage - (start + size));
  if (tail) munmap(start + size, tail);
  madvise(start, size, MADV_HUGEPAGE);  // advice only: ignore failure
  return start;
}
// bytes: as given to dm_alloc.
void dm_free(void* p, int64_t bytes) {
  if (p) munmap(p, huge_pages_of(bytes));
}

// Pack `count` SwiGLU blocks of width f into the group layout (see group_pass). gate_up:
// [count, 2f, d], down: [count, d, f], both contiguous, element size esize (4 fp32 / 2 fp16:
// bits are copied as they are). out: count blocks of ceil(f/NB) groups of 3*NB*dp elements.
// Padding neurons and columns are zero, so they add exactly nothing.
int dm_pack(const void* gate_up, const void* down, int64_t count, int64_t f, int64_t d, int64_t dp, int esize,
            void* out) {
  if (f <= 0 || d <= 0 || dp < d || dp % kPad || (esize != 2 && esize != 4)) return -1;
  const int64_t groups = (f + NB - 1) / NB;
  const int64_t group_elems = 3 * NB * dp;
  auto* dst = static_cast<char*>(out);
  const auto* gu = static_cast<const char*>(gate_up);
  const auto* dn = static_cast<const char*>(down);
  std::memset(dst, 0, static_cast<size_t>(count * groups * group_elems * esize));
  for (int64_t b = 0; b < count; ++b) {
    const char* gub = gu + b * 2 * f * d * esize;
    const char* dnb = dn + b * d * f * esize;
    for (int64_t n = 0; n < f; ++n) {
      char* grp = dst + (b * groups + n / NB) * group_elems * esize;
      const int64_t lane = n % NB;
      // Gate row n -> row 2*lane, up row n -> row 2*lane+1 of every column chunk.
      for (int which = 0; which < 2; ++which) {
        const char* row = gub + (which * f + n) * d * esize;
        for (int64_t c = 0; c < d; c += W) {
          const int64_t len = std::min<int64_t>(W, d - c);
          std::memcpy(grp + (c * R + (2 * lane + which) * W) * esize, row + c * esize, len * esize);
        }
      }
      // Down column n -> lane `lane` of every output chunk.
      char* dgrp = grp + R * dp * esize;
      for (int64_t o = 0; o < d; ++o)
        std::memcpy(dgrp + ((o / W) * NB * W + lane * W + o % W) * esize, dnb + (o * f + n) * esize, esize);
    }
  }
  return 0;
}

// Pack `count` quantized SwiGLU blocks of width f into the quantized group layout (see
// group_pass_q). Codes come unpacked, one unsigned code per byte: gate_up [count, 2f, d],
// down [count, d, f]; scales fp32: gate_up [count, 2f, d/gs], down [count, d, f/gs], stored as
// scale_dtype (ScaleDtype). d and f must be whole numbers of groups, gs a multiple of the
// vector width and of NB. -1: bad arguments; -2: a scale that scale_dtype cannot hold exactly
// (nothing of the kind is rounded).
int64_t dm_pack_q_bytes(int64_t count, int64_t f, int64_t d, int64_t gs, int bits, int scale_dtype) {
  return count * q_block_bytes(bits, gs, d, scale_dtype, f / NB);
}

int dm_pack_q(const uint8_t* gu_codes, const float* gu_scales, const uint8_t* dn_codes, const float* dn_scales,
              int64_t count, int64_t f, int64_t d, int64_t gs, int bits, int scale_dtype, void* out) {
  if ((bits != 4 && bits != 8) || f <= 0 || d <= 0 || gs <= 0 || gs % W || gs % NB || d % gs || f % gs) return -1;
  if (!valid_scale_dtype(scale_dtype)) return -1;
  const int64_t groups = f / NB, group_bytes = q_group_bytes(bits, gs, d, scale_dtype);
  const int64_t block_bytes = q_block_bytes(bits, gs, d, scale_dtype, groups), sbytes = scale_bytes(scale_dtype);
  const int zero = 1 << (bits - 1);
  auto* dst = static_cast<uint8_t*>(out);
  std::memset(dst, 0, static_cast<size_t>(count * block_bytes));
  // Code v of a lane: int8 stores v - 128 as a signed byte; int4 ORs it into its nibble.
  auto put = [bits, zero](uint8_t* byte, int which, uint8_t v) {
    if (bits == 8)
      *byte = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(v) - zero));
    else
      *byte |= static_cast<uint8_t>((v & 15) << (4 * which));
  };
  for (int64_t b = 0; b < count; ++b) {
    uint8_t* blk = dst + b * block_bytes;
    for (int64_t n = 0; n < f; ++n) {
      uint8_t* grp = blk + (n / NB) * group_bytes;
      const int64_t lane = n % NB;
      for (int which = 0; which < 2; ++which) {
        const int64_t row = which * f + n, r = 2 * lane + which;
        const uint8_t* codes = gu_codes + (b * 2 * f + row) * d;
        const float* scales = gu_scales + (b * 2 * f + row) * (d / gs);
        for (int64_t q = 0; q < d / gs; ++q) {
          if (!store_scale(scales[q], scale_dtype, grp + (q * R + r) * sbytes)) return -2;
          uint8_t* qg = grp + q_scale_area_bytes(gs, d, scale_dtype) + q * (R * gs * bits / 8);
          for (int64_t c = 0; c < gs; ++c) {
            uint8_t* chunk = qg + (c / W) * (R * W * bits / 8);
            const int64_t i = c % W;
            if (bits == 8)
              put(chunk + r * W + i, 0, codes[q * gs + c]);
            else  // lane i (4 bytes), bits 4r..4r+3
              put(chunk + 4 * i + r / 2, static_cast<int>(r % 2), codes[q * gs + c]);
          }
        }
      }
      uint8_t* down = grp + q_gate_up_bytes(bits, gs, d, scale_dtype);
      for (int64_t o = 0; o < d; ++o) {
        uint8_t* chunk = down + (o / W) * (NB * W * bits / 8);
        const uint8_t v = dn_codes[(b * d + o) * f + n];
        if (bits == 8)
          put(chunk + lane * W + o % W, 0, v);
        else  // lane o % W (2 bytes), bits 4n..4n+3
          put(chunk + 2 * (o % W) + lane / 2, static_cast<int>(lane % 2), v);
      }
    }
    uint8_t* dscales = blk + groups * group_bytes;
    for (int64_t q = 0; q < f / gs; ++q)
      for (int64_t o = 0; o < d; ++o)
        if (!store_scale(dn_scales[(b * d + o) * (f / gs) + q], scale_dtype, dscales + (q * d + o) * sbytes)) return -2;
  }
  return 0;
}

// Pad rows [rows, d] to [rows, dp] (zeros), element size esize. Used for router weights.
int dm_pad_rows(const void* src, int64_t rows, int64_t d, int64_t dp, int esize, void* out) {
  if (dp < d || dp % kPad || (esize != 2 && esize != 4)) return -1;
  auto* dst = static_cast<char*>(out);
  std::memset(dst, 0, static_cast<size_t>(rows * dp * esize));
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * dp * esize, static_cast<const char*>(src) + r * d * esize, d * esize);
  return 0;
}

// logits[t, r] = x[t] . w[r] for x [tokens, dp] (fp32, zero-padded) and w [rows, dp].
// pool may be null: the router is small (N*d weights), so a layer call computes it on the
// calling thread while the pool's workers are still waking up.
int dm_router(void* pool, int dtype, const void* w, int64_t rows, int64_t dp, const float* x, int64_t tokens,
              float* logits) {
  if (dp % kPad || rows <= 0 || tokens <= 0 || (dtype != 0 && dtype != 1)) return -1;
  RouterJob job{dtype, w, rows, dp, tokens, x, logits};
  if (pool)
    static_cast<Pool*>(pool)->run(router_job, &job);
  else
    router_job(&job, 0, 1);
  return 0;
}

// A packed layer, described once by the caller (Python mirrors this struct with ctypes).
struct dm_layer {
  int32_t dtype;             // weights: 0 fp32, 1 fp16
  int32_t score_func;        // 0 softmax, 1 sigmoid
  int32_t department_score;  // 0 max, 1 sum_top2, 2 sum
  int32_t norm_topk_prob;    // 0 or 1
  int64_t d, dp;             // hidden size, padded row length
  int64_t num_departments, experts_per_department, top_k, top_departments;
  float routed_scaling_factor;
  int32_t router_dtype;      // router rows: 0 fp32, 1 fp16 (float32 or the weights' dtype)
  const void* router;        // [N, dp] router rows
  const float* router_bias;  // [N] fp32 selection bias, or null
  const void* departments;   // packed shared parts of the D departments, groups_s groups each, or null
  int64_t groups_s;
  const void* experts;  // packed private parts of the N experts, groups_p groups each, or null
  int64_t groups_p;
  const void* shared;  // packed always-on shared experts, groups_sh groups, or null
  int64_t groups_sh;
  const float* shared_gate;  // [dp] fp32 Qwen2-style gate of the shared experts, or null (a = 1)
  int32_t weight_bits;       // 0: FFN weights of dtype; 4 or 8: quantized, packed by dm_pack_q
  int32_t group_size;        // columns per scale when quantized
  // Biases and the activation (spec, "Extensions (third wave)"), all fp32; null when absent.
  int32_t activation;  // 0 swiglu, 1 swiglu_clamped
  float swiglu_alpha, swiglu_limit;
  const float* router_logit_bias;  // [N], added to the logits before routing
  const float* departments_bias;   // gate/up biases, [D, groups_s, R] (row order of the groups)
  const float* experts_bias;       // [N, groups_p, R]
  const float* shared_bias;        // [groups_sh, R]
  const float* experts_down_bias;  // [N, dp]
  const float* shared_down_bias;   // [dp]
  int32_t scale_dtype;             // quantized: the scales' ScaleDtype (dm_pack_q's)
};

}  // extern "C"

namespace {

// The spec's routing (steps 1-5) is native/cuda/deamoeRouting.cuh's routeToken, the code
// the CUDA kernels run, here on one serial lane; it makes deamoe_trt/routing.py's decisions
// (tests/cpu and tests/native/cuda hold both to them, ties and non-finite tokens included).
// Route every token; kept [tokens, g] (stage-1 departments, best first) and scores
// [tokens, N] (s) are written when not null.
void route_all(const dm_layer& L, const float* logits, int64_t tokens, int64_t* ids, float* w, int64_t* kept,
               float* scores) {
  using namespace deamoe::detail;
  const RoutingConfig cfg{static_cast<int32_t>(L.num_departments * L.experts_per_department),
                          static_cast<int32_t>(L.num_departments),
                          static_cast<int32_t>(L.experts_per_department),
                          static_cast<int32_t>(L.top_k),
                          static_cast<int32_t>(L.top_departments),
                          L.score_func,
                          L.department_score,
                          L.norm_topk_prob,
                          L.routed_scaling_factor};
  const int64_t N = cfg.numExperts, k = cfg.topK, g = cfg.topDepartments;
  const SerialLanes lane;
  const FloatBias bias{L.router_bias};
  std::vector<float> scratch(static_cast<size_t>(routingScratchFloats(cfg)));
  // routeToken writes int32 ids; the ABI's are int64.
  std::vector<int32_t> ids32(static_cast<size_t>(k)), departments32(static_cast<size_t>(k)),
      kept32(static_cast<size_t>(g));
  for (int64_t t = 0; t < tokens; ++t) {
    const float* z = logits + t * N;
    routeToken(lane, cfg, z, bias, scratch.data(), ids32.data(), w + t * k, departments32.data(), kept32.data());
    std::copy(ids32.begin(), ids32.end(), ids + t * k);
    if (kept) std::copy(kept32.begin(), kept32.end(), kept + t * g);
    if (scores) {
      const ScoreFn score = scoreFunction(lane, cfg, z);
      for (int64_t i = 0; i < N; ++i) scores[t * N + i] = score(z[i]);
    }
  }
}

bool valid(const dm_layer& L) {
  return L.dp % kPad == 0 && L.d > 0 && L.d <= L.dp && (L.dtype == 0 || L.dtype == 1) && L.num_departments > 0 &&
         L.experts_per_department > 0 && L.top_k > 0 && L.top_departments > 0 &&
         L.top_departments <= L.num_departments && L.top_k <= L.top_departments * L.experts_per_department &&
         (L.router_dtype == 0 || L.router_dtype == 1) && L.router != nullptr &&
         (L.activation == 0 || (L.activation == 1 && L.swiglu_limit > 0 && L.swiglu_alpha > 0)) &&
         (L.weight_bits == 0 ||
          ((L.weight_bits == 4 || L.weight_bits == 8) && L.group_size > 0 && L.group_size % W == 0 &&
           L.group_size % NB == 0 && L.d == L.dp && L.d % L.group_size == 0 && valid_scale_dtype(L.scale_dtype)));
}

// Run the blocks a routing asks for. Department j runs once for the tokens with any kept
// expert in j, weighted by W_j (the sum of their w_e in j); expert e once for the tokens that
// kept it; shared experts once for all tokens. Blocks run in ascending order, tokens
// ascending: the summation order is fixed.
void run_step(Pool* pool, const dm_layer& L, const float* x, int64_t tokens, const int64_t* expert_ids,
              const float* weights, const float* shared_w, float* y, float* scratch) {
  const int64_t D = L.num_departments, m = L.experts_per_department, N = D * m, k = L.top_k, dp = L.dp;
  Step s;
  s.dtype = L.dtype;
  s.bits = L.weight_bits;
  s.group_size = L.group_size;
  s.scale_dtype = L.scale_dtype;
  s.dp = dp;
  s.tokens = tokens;
  s.x = x;
  s.partial = scratch;
  s.act = Activation{L.activation, L.swiglu_alpha, L.swiglu_limit};
  if (L.weight_bits == 4) {  // once per step, for every row of every block
    const int64_t gs = L.group_size;
    s.xsum.resize(static_cast<size_t>(tokens * (dp / gs)));
    for (int64_t t = 0; t < tokens; ++t) group_sums(x + t * dp, dp, gs, s.xsum.data() + t * (dp / gs));
    s.int4_mode = g_int4_mode.load(std::memory_order_relaxed);
    if (s.int4_mode == kSubnormal) {
      // x * 2^64 would overflow from |x| = 2^64 on (never seen in a model, but possible):
      // such a step takes the conversion instead.
      const float shift = std::ldexp(1.0f, kSubnormalXShift);
      float largest = 0.0f;
      s.x_shifted.resize(static_cast<size_t>(tokens * dp));
      for (int64_t i = 0; i < tokens * dp; ++i) {
        s.x_shifted[i] = x[i] * shift;
        largest = std::max(largest, std::fabs(x[i]));
      }
      if (!(largest < 0x1p60f)) s.int4_mode = kConvert;
    }
  }
#if defined(DEAMOE_AMX)
  s.amx = L.weight_bits && g_amx_mode.load(std::memory_order_relaxed) == 1 && tokens >= kAmxMinBlockTokens &&
          tokens <= kAmxTokens && L.group_size % 32 == 0;
  if (s.amx) {
    s.xb.resize(static_cast<size_t>(dp / 32 * 3 * 16 * tokens + 16));
    amx::build_x(x, dp, static_cast<int>(tokens), dp, s.xb.data());
  }
#endif
  const int64_t esize = L.dtype == 1 ? 2 : 4;
  auto block = [&](const void* base, int64_t index, int64_t groups) {
    if (L.weight_bits)  // groups, then the block's down scales
      return static_cast<const char*>(base) +
             index * q_block_bytes(L.weight_bits, L.group_size, dp, L.scale_dtype, groups);
    return static_cast<const char*>(base) + index * groups * 3 * NB * dp * esize;
  };

  if (L.departments && L.groups_s > 0) {
    // W[t, j] = sum of the token's w_e over its kept experts in department j.
    std::vector<float> dw(static_cast<size_t>(tokens * D), 0.0f);
    std::vector<char> used(static_cast<size_t>(tokens * D), 0);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < k; ++i) {
        const int64_t j = expert_ids[t * k + i] / m;
        dw[t * D + j] += weights[t * k + i];
        used[t * D + j] = 1;
      }
    for (int64_t j = 0; j < D; ++j) {
      const int64_t begin = static_cast<int64_t>(s.tok_idx.size());
      for (int64_t t = 0; t < tokens; ++t)
        if (used[t * D + j]) {
          s.tok_idx.push_back(t);
          s.tok_w.push_back(dw[t * D + j]);
        }
      const int64_t count = static_cast<int64_t>(s.tok_idx.size()) - begin;
      const float* bias = L.departments_bias ? L.departments_bias + j * L.groups_s * R : nullptr;
      if (count) s.tasks.push_back(Task{block(L.departments, j, L.groups_s), L.groups_s, begin, count, bias});
    }
  }
  if (L.experts && L.groups_p > 0) {
    // Expert e's tokens, ascending, by a counting pass over the kept (token, slot) pairs.
    std::vector<int64_t> first(static_cast<size_t>(N + 1), 0);
    for (int64_t i = 0; i < tokens * k; ++i) ++first[expert_ids[i] + 1];
    for (int64_t e = 0; e < N; ++e) first[e + 1] += first[e];
    const int64_t base = static_cast<int64_t>(s.tok_idx.size());
    s.tok_idx.resize(static_cast<size_t>(base + tokens * k));
    s.tok_w.resize(static_cast<size_t>(base + tokens * k));
    std::vector<int64_t> fill(first.begin(), first.end() - 1);
    for (int64_t i = 0; i < tokens * k; ++i) {
      const int64_t slot = base + fill[expert_ids[i]]++;
      s.tok_idx[slot] = i / k;
      s.tok_w[slot] = weights[i];
    }
    for (int64_t e = 0; e < N; ++e)
      if (first[e + 1] > first[e])
        s.tasks.push_back(Task{block(L.experts, e, L.groups_p), L.groups_p, base + first[e], first[e + 1] - first[e],
                               L.experts_bias ? L.experts_bias + e * L.groups_p * R : nullptr,
                               L.experts_down_bias ? L.experts_down_bias + e * dp : nullptr});
  }
  if (L.shared && L.groups_sh > 0) {
    const int64_t begin = static_cast<int64_t>(s.tok_idx.size());
    for (int64_t t = 0; t < tokens; ++t) {
      s.tok_idx.push_back(t);
      s.tok_w.push_back(shared_w ? shared_w[t] : 1.0f);
    }
    s.tasks.push_back(Task{L.shared, L.groups_sh, begin, tokens, L.shared_bias, L.shared_down_bias});
  }

  const int slices = step_slices(pool->size());
  pool->run_slices(step_job, &s, slices);

  // Sum the slices' partial outputs in slice order (deterministic), dropping the padding;
  // int4's are in kInt4DownUnit.
  const float unit = L.weight_bits == 4 ? 1.0f / kInt4DownUnit[s.int4_mode] : 1.0f;
  for (int64_t t = 0; t < tokens; ++t) {
    float* out = y + t * L.d;
    std::memcpy(out, scratch + t * dp, static_cast<size_t>(L.d) * sizeof(float));
    for (int k = 1; k < slices; ++k) {
      const float* p = scratch + (k * tokens + t) * dp;
      for (int64_t c = 0; c < L.d; ++c) out[c] += p[c];
    }
    if (unit != 1.0f)
      for (int64_t c = 0; c < L.d; ++c) out[c] *= unit;
  }
}

}  // namespace

extern "C" {

// Routing only, from logits [tokens, N]: ids and w [tokens, k]; kept [tokens, g] and scores
// [tokens, N] when not null (for tests, and callers that want the whole decision).
int dm_route(const dm_layer* layer, const float* logits, int64_t tokens, int64_t* ids, float* w, int64_t* kept,
             float* scores) {
  if (!layer || !valid(*layer) || tokens <= 0) return -1;
  route_all(*layer, logits, tokens, ids, w, kept, scores);
  return 0;
}

// One MoE step for given routing (from deamoe_trt.routing, say).
//   x:           [tokens, dp] fp32, zero-padded activations
//   expert_ids:  [tokens, k] int64 kept experts; weights: [tokens, k] fp32 w_e
//   shared_w:    [tokens] fp32 weight a of the shared experts, or null (a = 1)
//   y:           [tokens, d] fp32 output; scratch: >= dm_step_slices(pool) * tokens * dp floats
int dm_moe_forward(void* pool, const dm_layer* layer, const float* x, int64_t tokens, const int64_t* expert_ids,
                   const float* weights, const float* shared_w, float* y, float* scratch) {
  if (!layer || !valid(*layer) || tokens <= 0) return -1;
  const int64_t N = layer->num_departments * layer->experts_per_department;
  for (int64_t i = 0; i < tokens * layer->top_k; ++i)
    if (expert_ids[i] < 0 || expert_ids[i] >= N) return -2;
  run_step(static_cast<Pool*>(pool), *layer, x, tokens, expert_ids, weights, shared_w, y, scratch);
  return 0;
}

// The whole layer in one call: router logits (on this thread, while the pool's workers wake
// up), routing, shared-expert gate, the experts. logits [tokens, N], ids and w [tokens, k]
// receive the router's outputs and the decisions.
int dm_layer_forward(void* pool_handle, const dm_layer* layer, const float* x, int64_t tokens, float* y, float* scratch,
                     float* logits, int64_t* ids, float* w) {
  if (!layer || !valid(*layer) || tokens <= 0) return -1;
  const dm_layer& L = *layer;
  auto* pool = static_cast<Pool*>(pool_handle);
  pool->wake();
  const int64_t N = L.num_departments * L.experts_per_department;
  RouterJob router{L.router_dtype, L.router, N, L.dp, tokens, x, logits};
  router_job(&router, 0, 1);
  if (L.router_logit_bias)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < N; ++i) logits[t * N + i] += L.router_logit_bias[i];
  route_all(L, logits, tokens, ids, w, nullptr, nullptr);
  std::vector<float> shared_w;
  if (L.shared_gate) {
    shared_w.resize(static_cast<size_t>(tokens));
    const float* xs[kRouterTokensPerPass];
    for (int64_t t = 0; t < tokens; ++t) {
      xs[0] = x + t * L.dp;
      float dot;
      dot_rows<1>(L.shared_gate, xs, L.dp, &dot);
      shared_w[t] = 1.0f / (1.0f + std::exp(-dot));
    }
  }
  run_step(pool, L, x, tokens, ids, w, L.shared_gate ? shared_w.data() : nullptr, y, scratch);
  return 0;
}

// Keep every thread of the pool busy for `us` microseconds. Benchmarks use it between timed
// calls: an idle vCPU is halted by the hypervisor and takes ~0.2 ms to wake, which would
// land on whichever runtime is timed next; a decoder's cores never idle like that.
void dm_busy_wait(void* pool, int64_t us) {
  BusyJob job{Clock::now() + std::chrono::microseconds(us)};
  static_cast<Pool*>(pool)->run(busy_job, &job);
}

// Read n floats of buf with every thread of the pool (each a contiguous share); returns
// their sum so the reads cannot be optimised away. n must be a multiple of 64 * threads.
double dm_stream_read(void* pool_handle, const float* buf, int64_t n) {
  auto* pool = static_cast<Pool*>(pool_handle);
  std::vector<double> sums(static_cast<size_t>(pool->size()), 0.0);
  StreamJob job{buf, n, sums.data()};
  pool->run(stream_job, &job);
  double total = 0;
  for (double v : sums) total += v;
  return total;
}

}  // extern "C"

// The whole language model's decode step, on the pieces above.
#include "deamoe_cpu_model.h"
