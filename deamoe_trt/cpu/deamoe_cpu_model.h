// deamoe_cpu_model.h: one decode step of a whole DeaMoE language model on the CPU kernel.
// Included at the end of deamoe_cpu.cpp (one translation unit: it runs the MoE step, the
// thread pool and the vector helpers defined there).
//
// A step (one token, or a prompt's tokens together) is: embedding row -> per block
// [RMSNorm -> q/k/v projections (+ biases, q/k norms, clipping) -> rotary -> attention over
// the block's KV cache (grouped-query heads, sliding window, sinks) -> output projection ->
// residual -> RMSNorm -> FFN (the DeaMoE layer step of deamoe_cpu.cpp; a dense SwiGLU MLP
// as a layer with one always-on part) -> residual] -> RMSNorm -> head. Everything stays in
// native code between the embedding and the logits, and the same pool of threads runs every
// matrix of every block.
//
// Projections are matrix-vector products over weights packed four rows at a time (a quad:
// fp32 or fp16, see gemv_quads; or int8/int4 codes, see q_quad_bytes), cut into slices of
// contiguous quads that the threads claim (one load of x per four weight vectors), so every
// weight is read once per step. Activations, norms, rotary, attention and the KV cache are
// fp32.
//
// The KV cache is the session's: [position][kv head][head_dim] per block, keys rotated. A
// block attending to every key keeps every position (grown by doubling up to the context);
// a sliding block keeps its window in a ring (position p in slot p % window).

extern "C" {

// A projection y = W x (+ b), W [rows, cols_p], b fp32 or null. bits 0: W in the model's
// weight dtype, columns zero-padded to a multiple of dm_row_pad, packed in quads by
// dm_pack_linear. bits 4 or 8:
// weight-only quantized (deamoe_trt/quant.py), packed by dm_pack_linear_q (cols_p = cols, a
// whole number of groups of group_size columns), its scales stored as scale_dtype (ScaleDtype).
struct dm_lm_linear {
  const void* w;
  const float* bias;
  int64_t rows, cols_p;
  int32_t bits, group_size;
  int32_t scale_dtype;
};

}  // extern "C"

namespace {

// Rows are computed four at a time (a quad): one load of x serves four weight vectors, and
// a quad is one contiguous run of memory. Threads get whole quads.
constexpr int kQuad = 4;

// Float layout (dm_pack_linear), per quad of rows (rows padded to a multiple of four with
// zero rows), per column chunk (W columns): the four rows' W values. A quad is one stream,
// read front to back; row-major, it would be four streams of one row each (4 KiB apiece at
// d = 2048 in fp16), each of which the hardware prefetcher picks up anew: about 10% slower
// on AMD EPYC (AVX-512, 2 threads, 16 MiB fp16 matrices in huge pages).
inline int64_t quad_elems(int64_t rows, int64_t cols_p) { return (rows + kQuad - 1) / kQuad * kQuad * cols_p; }

// Quantized layout, per quad of rows (rows padded to a multiple of four with zero scales),
// per quantization group of GS columns: the quad's four scales, then per column chunk
// (W columns): int8: four rows of W signed codes (q - 128); int4: W 16-bit lanes, lane i
// holding the four rows' codes of column i, row r in bits 4r..4r+3 (the kernel's down-part
// lanes). Row r's int4 codes are used as masked out of the lanes, q * 2^(4r) (exact as a
// float), and its sum over the groups is multiplied by 2^(-4r) (kQuadRowFactor, exact) once,
// so that a group costs one multiply-add per row besides its codes; the zero point 8 is taken
// off once per row with the sums of x per group: x . w = sum_G s_G (sum_{j in G} x_j q_j - 8 sum_{j in G} x_j).
//
// The scales are stored as ScaleDtype (deamoe_cpu.cpp), like the FFNs'.

inline int64_t q_group_bytes(int bits, int64_t gs, int scale_dtype) {
  return kQuad * scale_bytes(scale_dtype) + kQuad * gs * bits / 8;
}

inline int64_t q_quad_bytes(int bits, int64_t cols, int64_t gs, int scale_dtype) {
  return cols / gs * q_group_bytes(bits, gs, scale_dtype);
}

constexpr float kQuadRowFactor[kQuad] = {1.0f, 0x1p-4f, 0x1p-8f, 0x1p-12f};

// A projection applied to `tokens` inputs: x [tokens, x_stride], y [tokens, y_stride].
struct LinearRows {
  dm_lm_linear L;
  const float* x;
  float* y;
  int64_t tokens, x_stride, y_stride;
  const float* xsum;       // int4: [tokens, cols / group_size] sums of x per group
  const float* x_shifted;  // int4 kSubnormal: x * 2^kSubnormalXShift, [tokens, x_stride]
  int int4_mode;
  const uint32_t* xb = nullptr;  // quantized on the tiles: x as they read it (gemv_quads_q_amx)
};

// y[t, r] = w[r] . x[t] (+ bias[r]) for tokens [t0, t0 + TT) and the four rows of one quad:
// each chunk of the quad's weights is loaded (and widened from fp16) once for the TT tokens.
// A token's sums take the same multiply-adds in the same order whatever TT: the same bits
// as the token alone.
template <typename WT, int TT>
inline void gemv_quad_tokens(const LinearRows& J, int64_t quad, int64_t t0) {
  const float* bias = J.L.bias;
  const int64_t n = J.L.cols_p, rows = J.L.rows;
  const WT* w = static_cast<const WT*>(J.L.w) + quad * kQuad * n;
  V acc[TT][kQuad];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < kQuad; ++r) acc[t][r] = vzero();
  const float* x0 = J.x + t0 * J.x_stride;
  for (int64_t c = 0; c < n; c += W, w += kQuad * W) {
    // Near and far (see prefetch_ahead), on the first tile's pass: the others read the caches.
    if (t0 == 0) prefetch_ahead<true>(reinterpret_cast<const uint8_t*>(w), kQuad * W * sizeof(WT));
    const V w0 = vload(w), w1 = vload(w + W), w2 = vload(w + 2 * W), w3 = vload(w + 3 * W);
#pragma GCC unroll 4
    for (int t = 0; t < TT; ++t) {
      const V x = vload(x0 + t * J.x_stride + c);
      acc[t][0] = vfma(w0, x, acc[t][0]);
      acc[t][1] = vfma(w1, x, acc[t][1]);
      acc[t][2] = vfma(w2, x, acc[t][2]);
      acc[t][3] = vfma(w3, x, acc[t][3]);
    }
  }
  for (int t = 0; t < TT; ++t) {
    float* y = J.y + (t0 + t) * J.y_stride;
    for (int r = 0; r < kQuad && quad * kQuad + r < rows; ++r) {
      const int64_t row = quad * kQuad + r;
      y[row] = vsum(acc[t][r]) + (bias ? bias[row] : 0.0f);
    }
  }
}

// Tokens per tile: their accumulators, the quad's four weight vectors and x in registers
// (AVX-512's 32 vector registers hold four tokens' 16, AVX2's 16 two tokens' 8).
#if defined(__AVX512F__)
constexpr int kTokenTile = 4;
#else
constexpr int kTokenTile = 2;
#endif

// y[t, r] = w[r] . x[t] (+ bias[r]) for the rows of quads [q0, q1), every token: a quad is
// read from memory for the first tile of tokens and from the caches for the others.
template <typename WT>
void gemv_quads(const LinearRows& J, int64_t q0, int64_t q1) {
  for (int64_t quad = q0; quad < q1; ++quad) {
    int64_t t = 0;
    for (; t + kTokenTile <= J.tokens; t += kTokenTile) gemv_quad_tokens<WT, kTokenTile>(J, quad, t);
    for (; t < J.tokens; ++t) gemv_quad_tokens<WT, 1>(J, quad, t);
  }
}

#if defined(__AVX512F__)
// acc[r] += row r's int4 codes (masked out of the lanes at p, as floats: Int4Mode) * x[0, W)
// for the four rows of one chunk. In assembly because GCC folds the load of x into each of
// the four multiply-adds, and four loads of the same 64 bytes per 32 bytes of codes took
// 10-15% off the loop (AMD EPYC, AVX-512, 2 threads, an int4 [2048, 4096] projection).
template <int MODE>
inline void quad_chunk_int4(const uint8_t* p, const float* x, const __m512i (&masks)[kQuad], V (&acc)[kQuad]) {
  __m512 xr, t0, t1, t2, t3;
  __m512i lanes;
#define DEAMOE_QUAD_CHUNK_INT4(CONVERT)                                                                \
  asm("vmovups %[xp], %[xr]\n\t"                                                                       \
      "vpmovzxwd %[wp], %[lanes]\n\t"                                                                  \
      "vpandd %[m0], %[lanes], %[t0]\n\t"                                                              \
      "vpandd %[m1], %[lanes], %[t1]\n\t"                                                              \
      "vpandd %[m2], %[lanes], %[t2]\n\t"                                                              \
      "vpandd %[m3], %[lanes], %[t3]\n\t" CONVERT                                                      \
      "vfmadd231ps %[xr], %[t0], %[a0]\n\t"                                                            \
      "vfmadd231ps %[xr], %[t1], %[a1]\n\t"                                                            \
      "vfmadd231ps %[xr], %[t2], %[a2]\n\t"                                                            \
      "vfmadd231ps %[xr], %[t3], %[a3]"                                                                \
      : [a0] "+v"(acc[0]), [a1] "+v"(acc[1]), [a2] "+v"(acc[2]), [a3] "+v"(acc[3]), [xr] "=&v"(xr),    \
        [lanes] "=&v"(lanes), [t0] "=&v"(t0), [t1] "=&v"(t1), [t2] "=&v"(t2), [t3] "=&v"(t3)           \
      : [xp] "m"(*reinterpret_cast<const __m512*>(x)), [wp] "m"(*reinterpret_cast<const __m256i*>(p)), \
        [m0] "v"(masks[0]), [m1] "v"(masks[1]), [m2] "v"(masks[2]), [m3] "v"(masks[3]))
  if constexpr (MODE == kSubnormal)
    DEAMOE_QUAD_CHUNK_INT4("");
  else
    DEAMOE_QUAD_CHUNK_INT4(
        "vcvtdq2ps %[t0], %[t0]\n\tvcvtdq2ps %[t1], %[t1]\n\tvcvtdq2ps %[t2], %[t2]\n\tvcvtdq2ps %[t3], %[t3]\n\t");
#undef DEAMOE_QUAD_CHUNK_INT4
}

// kConvert's int4 codes on AVX-512, by table: row r's codes are the lanes shifted down 4r
// bits, looked up in `table` (the floats 0..15) by vpermps, which reads each index's low 4
// bits only: q itself, not q * 2^(4r). A shift and a lookup for a mask and a conversion:
// on Intel's AVX-512 cores the conversion and the 512-bit shifts share one port and the
// lookup has the other, and the whole int4 step ran 1.07x faster (median of 8 alternating
// runs, Intel Xeon VM, 2 threads). The FFN loops keep the conversion: eight rows a lane
// need seven shifts, and their lookup version ran 10% slower (docs/benchmarks.md).
inline void quad_chunk_int4_lookup(const uint8_t* p, const float* x, __m512 table, V (&acc)[kQuad]) {
  __m512 xr, t0, t1, t2, t3;
  __m512i lanes, i1, i2, i3;
  asm("vmovups %[xp], %[xr]\n\t"
      "vpmovzxwd %[wp], %[lanes]\n\t"
      "vpsrld $4, %[lanes], %[i1]\n\t"
      "vpsrld $8, %[lanes], %[i2]\n\t"
      "vpsrld $12, %[lanes], %[i3]\n\t"
      "vpermps %[table], %[lanes], %[t0]\n\t"
      "vpermps %[table], %[i1], %[t1]\n\t"
      "vpermps %[table], %[i2], %[t2]\n\t"
      "vpermps %[table], %[i3], %[t3]\n\t"
      "vfmadd231ps %[xr], %[t0], %[a0]\n\t"
      "vfmadd231ps %[xr], %[t1], %[a1]\n\t"
      "vfmadd231ps %[xr], %[t2], %[a2]\n\t"
      "vfmadd231ps %[xr], %[t3], %[a3]"
      : [a0] "+v"(acc[0]), [a1] "+v"(acc[1]), [a2] "+v"(acc[2]), [a3] "+v"(acc[3]), [xr] "=&v"(xr),
        [lanes] "=&v"(lanes), [i1] "=&v"(i1), [i2] "=&v"(i2), [i3] "=&v"(i3), [t0] "=&v"(t0), [t1] "=&v"(t1),
        [t2] "=&v"(t2), [t3] "=&v"(t3)
      : [xp] "m"(*reinterpret_cast<const __m512*>(x)), [wp] "m"(*reinterpret_cast<const __m256i*>(p)),
        [table] "v"(table));
}
#endif

// total + acc * (the float at s): the scale is broadcast by the multiply-add's own load
// (AVX-512's embedded broadcast) rather than by shuffles, which compete with the codes'
// unpacking for the vector ports: with the scales' dtype a template argument, the whole
// int4 step ran 1.07x faster (median of 8 alternating runs, Intel Xeon VM, 2 threads;
// docs/benchmarks.md).
inline V fma_scale(V acc, const float* s, V total) {
#if defined(__AVX512F__)
  asm("vfmadd231ps %[s]%{1to16%}, %[acc], %[total]" : [total] "+v"(total) : [acc] "v"(acc), [s] "m"(*s));
  return total;
#else
  return vfma(acc, _mm256_broadcast_ss(s), total);
#endif
}

// Quads [q0, q1) of a quantized projection with scales stored as SD. int4 takes the kernel's
// two ways of turning a masked code into a float (Int4Mode): kConvert, or kSubnormal (the
// masked bits read as the subnormal q * 2^(4r-149), against x * 2^64: the dot products come
// out in 2^-85 and are multiplied by kInt4GateUpUnit, exactly, once per row). Row r's codes
// come out as q * 2^(4r) (q itself by quad_chunk_int4_lookup); its sum is multiplied by
// kQuadRowFactor[r] once, at the end (a power of two: the same bits as scaling every group's
// scale by it).
// Tokens [t0, t0 + TT) of one quad of a quantized projection (several tokens in a step): each
// chunk's codes are turned into floats once for the TT tokens. Row r's codes come out as
// q * 2^(4r) (int4) and its sums are scaled back exactly at the end, so a token's logits are
// those of the one-token loops below.
template <int BITS, int MODE, int SD, int TT>
void gemv_quad_q_tokens(const LinearRows& J, int64_t quad, int64_t t0) {
  const int64_t cols = J.L.cols_p, gs = J.L.group_size, rows = J.L.rows;
  constexpr int sbytes = kQuad * scale_bytes(SD);
  const uint8_t* p = static_cast<const uint8_t*>(J.L.w) + quad * q_quad_bytes(BITS, cols, gs, SD);
  const float* x0 = (MODE == kSubnormal ? J.x_shifted : J.x) + t0 * J.x_stride;
  V total[TT][kQuad];
  __m128 zero[TT];  // row r in lane r: sum_G s_G,r * xsum_G
  for (int t = 0; t < TT; ++t) {
    zero[t] = _mm_setzero_ps();
    for (int r = 0; r < kQuad; ++r) total[t][r] = vzero();
  }
  for (int64_t g = 0; g < cols / gs; ++g) {
    const __m128 s = load_scales(p, SD);
    alignas(16) float scale[kQuad];
    _mm_store_ps(scale, s);
    p += sbytes;
    V acc[TT][kQuad];
    for (int t = 0; t < TT; ++t)
      for (int r = 0; r < kQuad; ++r) acc[t][r] = vzero();
    for (int64_t c = g * gs; c < (g + 1) * gs; c += W) {
      if (t0 == 0) prefetch_ahead<BITS == 4 && MODE == kSubnormal>(p, BITS == 4 ? 2 * W : kQuad * W);
      V w[kQuad];
      if constexpr (BITS == 4) {
        const VI lanes = load_u16(p);
        p += 2 * W;
#pragma GCC unroll 4
        for (int r = 0; r < kQuad; ++r) {
          const VI bits = iand(lanes, 0xFu << (4 * r));
          w[r] = MODE == kSubnormal ? as_float(bits) : to_float(bits);
        }
      } else {
#pragma GCC unroll 4
        for (int r = 0; r < kQuad; ++r) w[r] = to_float(load_s8(p + r * W));
        p += kQuad * W;
      }
#pragma GCC unroll 4
      for (int t = 0; t < TT; ++t) {
        const V x = vload(x0 + t * J.x_stride + c);
        for (int r = 0; r < kQuad; ++r) acc[t][r] = vfma(w[r], x, acc[t][r]);
      }
    }
    for (int t = 0; t < TT; ++t) {
      for (int r = 0; r < kQuad; ++r) total[t][r] = fma_scale(acc[t][r], scale + r, total[t][r]);
      if constexpr (BITS == 4) zero[t] = _mm_fmadd_ps(s, _mm_set1_ps(J.xsum[(t0 + t) * (cols / gs) + g]), zero[t]);
    }
  }
  for (int t = 0; t < TT; ++t) {
    alignas(16) float zeros[kQuad];
    _mm_store_ps(zeros, zero[t]);
    float* y = J.y + (t0 + t) * J.y_stride;
    for (int r = 0; r < kQuad; ++r) {
      const int64_t row = quad * kQuad + r;
      if (row >= rows) break;
      const float unit = BITS == 4 ? kInt4GateUpUnit[MODE] * kQuadRowFactor[r] : 1.0f;
      y[row] = vsum(total[t][r]) * unit - (BITS == 4 ? 8.0f * zeros[r] : 0.0f) + (J.L.bias ? J.L.bias[row] : 0.0f);
    }
  }
}

// Tokens per tile of the quantized loops: their sums and the chunk's four widened rows in
// registers.
constexpr int kQTokenTile = 2;

#if defined(DEAMOE_AMX)
// Quads [q0, q1) of a quantized projection on the tiles (deamoe_cpu.cpp, "AMX"), for tokens in
// tiles of up to 16: up to 16 quads at a time, column chunk by column chunk: the chunk's
// activations loaded once (tiles 3, 6, 7: J.xb) for the four sets of four quads, each set's 16
// rows the weight tile (5) with its sums in a tile of its own (0, 1, 2, 4); per quantization
// group the sums are stored and scaled into `total`. The codes of the next set are widened
// before this set's are loaded (a tile load waits for the vector stores of its bytes), into
// the other of two buffers. The table's codes are q - 8 (int4) and int8's are stored signed:
// no zero point to take off.
template <int BITS, int SD>
void gemv_quads_q_amx(const LinearRows& J, int64_t q0, int64_t q1) {
  const int64_t cols = J.L.cols_p, gs = J.L.group_size, rows = J.L.rows;
  constexpr int sbytes = kQuad * scale_bytes(SD);
  const int64_t quad_bytes = q_quad_bytes(BITS, cols, gs, SD), group_bytes = q_group_bytes(BITS, gs, SD);
  constexpr int64_t chunk_bytes = BITS == 4 ? 64 : 128;  // 32 columns of a quad
  const int64_t kcs = gs / 32, chunks = cols / 32;
  const __m512i table = amx::int4_table();
  amx::Tiles tiles;
  alignas(64) uint16_t a[2][16][32];
  alignas(64) float sums[4][16][16] = {};
  alignas(32) float scale[16][kQuad];
  alignas(64) float total[64][16];
  const uint8_t* w = static_cast<const uint8_t*>(J.L.w);
  for (int64_t t0 = 0; t0 < J.tokens; t0 += kAmxTokens) {
    const int T = static_cast<int>(std::min<int64_t>(kAmxTokens, J.tokens - t0));
    tiles.use(T);
    const uint32_t* xb = J.xb + t0 * chunks * 3 * 16;
    for (int64_t qs = q0; qs < q1; qs += 16) {
      const int nq = static_cast<int>(std::min<int64_t>(16, q1 - qs)), sets = (nq + 3) / 4;
      if (nq % 4)
        for (int i = 0; i < 2; ++i) std::memset(a[i][4 * (nq % 4)], 0, (16 - 4 * (nq % 4)) * sizeof a[0][0]);
      const uint8_t* quads = w + qs * quad_bytes;
      auto build = [&](int64_t step) {  // step = kc * sets + set: its quads' codes into a[step % 2]
        const int64_t kc = step / sets, set = step % sets;
        for (int i = 0; i < 4 && 4 * set + i < nq; ++i) {
          const uint8_t* p =
              quads + (4 * set + i) * quad_bytes + kc / kcs * group_bytes + sbytes + kc % kcs * chunk_bytes;
          if (t0 == 0) prefetch_ahead<true>(p, chunk_bytes);
          uint16_t (*rows4)[32] = a[step % 2] + 4 * i;
          if constexpr (BITS == 4) {
            const __m512i lanes = _mm512_loadu_si512(p);  // column c's four codes in lane c
            for (int r = 0; r < kQuad; ++r)
              _mm512_store_si512(rows4[r], _mm512_permutexvar_epi16(_mm512_srli_epi16(lanes, 4 * r), table));
          } else {
            for (int r = 0; r < kQuad; ++r) _mm512_store_si512(rows4[r], amx::int8_words(p + r * W, p + 64 + r * W));
          }
        }
      };
      amx::group_sums(
          xb, T, cols / gs, kcs, sets, a, sums, build,
          [&](int64_t q) {
            for (int i = 0; i < nq; ++i)
              _mm_store_ps(scale[i], load_scales(quads + i * quad_bytes + q * group_bytes, SD));
          },
          [&](int64_t q) {
            for (int m = 0; m < 4 * nq; ++m)
              _mm512_store_ps(total[m], vfma(_mm512_load_ps(sums[m / 16][m % 16]), vset1(scale[m / 4][m % 4]),
                                             q ? _mm512_load_ps(total[m]) : vzero()));
          });
      for (int m = 0; m < 4 * nq; ++m) {
        const int64_t row = qs * kQuad + m;
        if (row >= rows) break;
        const float bias = J.L.bias ? J.L.bias[row] : 0.0f;
        for (int t = 0; t < T; ++t) J.y[(t0 + t) * J.y_stride + row] = total[m][t] + bias;
      }
    }
  }
}
#endif

template <int BITS, int MODE, int SD>
void gemv_quads_q(const LinearRows& J, int64_t q0, int64_t q1) {
#if defined(DEAMOE_AMX)
  if (J.xb) return gemv_quads_q_amx<BITS, SD>(J, q0, q1);
#endif
  const int64_t cols = J.L.cols_p, gs = J.L.group_size, rows = J.L.rows;
  constexpr int sbytes = kQuad * scale_bytes(SD);
  const int64_t quad_bytes = q_quad_bytes(BITS, cols, gs, SD);
#if defined(__AVX512F__)
  const __m512i masks[kQuad] = {_mm512_set1_epi32(0xF), _mm512_set1_epi32(0xF0), _mm512_set1_epi32(0xF00),
                                _mm512_set1_epi32(0xF000)};
  const __m512 table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  constexpr bool lookup = BITS == 4 && MODE == kConvert;  // quad_chunk_int4_lookup
#else
  constexpr bool lookup = false;
#endif
  if (J.tokens > 1) {
    for (int64_t quad = q0; quad < q1; ++quad) {
      int64_t t = 0;
      for (; t + kQTokenTile <= J.tokens; t += kQTokenTile) gemv_quad_q_tokens<BITS, MODE, SD, kQTokenTile>(J, quad, t);
      for (; t < J.tokens; ++t) gemv_quad_q_tokens<BITS, MODE, SD, 1>(J, quad, t);
    }
    return;
  }
  for (int64_t quad = q0; quad < q1; ++quad)
    for (int64_t t = 0; t < J.tokens; ++t) {
      const uint8_t* p = static_cast<const uint8_t*>(J.L.w) + quad * quad_bytes;
      const float* xt = (MODE == kSubnormal ? J.x_shifted : J.x) + t * J.x_stride;
      const float* xsum = BITS == 4 ? J.xsum + t * (cols / gs) : nullptr;
      float* y = J.y + t * J.y_stride;
      V total[kQuad] = {vzero(), vzero(), vzero(), vzero()};
      __m128 zero = _mm_setzero_ps();  // row r in lane r: sum_G s_G,r * xsum_G
      for (int64_t g = 0; g < cols / gs; ++g) {
        const __m128 s = load_scales(p, SD);
        alignas(16) float widened[kQuad];
        const float* scale = reinterpret_cast<const float*>(p);
        if constexpr (SD != kScaleF32) {
          _mm_store_ps(widened, s);
          scale = widened;
        }
        p += sbytes;
        V acc[kQuad] = {vzero(), vzero(), vzero(), vzero()};
        for (int64_t c = g * gs; c < (g + 1) * gs; c += W) {
          // FAR in kSubnormal mode only, which is AMD's (see prefetch_ahead)
          prefetch_ahead<BITS == 4 && MODE == kSubnormal>(p, BITS == 4 ? 2 * W : kQuad * W);
#if defined(__AVX512F__)
          if constexpr (BITS == 4) {
            if constexpr (lookup)
              quad_chunk_int4_lookup(p, xt + c, table, acc);
            else
              quad_chunk_int4<MODE>(p, xt + c, masks, acc);
            p += 2 * W;
            continue;
          }
#endif
          const V x = vload(xt + c);
          if constexpr (BITS == 4) {
            const VI lanes = load_u16(p);
            p += 2 * W;
#pragma GCC unroll 4
            for (int r = 0; r < kQuad; ++r) {
              const VI bits = iand(lanes, 0xFu << (4 * r));
              acc[r] = vfma(MODE == kSubnormal ? as_float(bits) : to_float(bits), x, acc[r]);
            }
          } else {
#pragma GCC unroll 4
            for (int r = 0; r < kQuad; ++r) acc[r] = vfma(to_float(load_s8(p + r * W)), x, acc[r]);
            p += kQuad * W;
          }
        }
        for (int r = 0; r < kQuad; ++r) total[r] = fma_scale(acc[r], scale + r, total[r]);
        if constexpr (BITS == 4) zero = _mm_fmadd_ps(s, _mm_set1_ps(xsum[g]), zero);
      }
      alignas(16) float zeros[kQuad];
      _mm_store_ps(zeros, zero);
      for (int r = 0; r < kQuad; ++r) {
        const int64_t row = quad * kQuad + r;
        if (row >= rows) break;
        const float unit = BITS == 4 && !lookup ? kInt4GateUpUnit[MODE] * kQuadRowFactor[r] : 1.0f;
        y[row] = vsum(total[r]) * unit - (BITS == 4 ? 8.0f * zeros[r] : 0.0f) + (J.L.bias ? J.L.bias[row] : 0.0f);
      }
    }
}

template <int BITS, int MODE = kConvert>
void gemv_quads_q_any(const LinearRows& J, int64_t q0, int64_t q1) {
  switch (J.L.scale_dtype) {
    case kScaleF16: return gemv_quads_q<BITS, MODE, kScaleF16>(J, q0, q1);
    case kScaleBF16: return gemv_quads_q<BITS, MODE, kScaleBF16>(J, q0, q1);
    default: return gemv_quads_q<BITS, MODE, kScaleF32>(J, q0, q1);
  }
}

// Up to three projections in one job (q, k and v): their quads cut evenly into slices as
// one range, each slice one contiguous run of the bytes. As in the MoE step, the threads claim
// the slices (a worker still waking up leaves its share to the others), and a row's sum does
// not depend on which thread ran it.
struct GemvJob {
  int dtype;  // float weights: 0 fp32, 1 fp16
  int count;
  LinearRows mats[3];
};

void gemv_job(void* ctx, int tid, int nthreads) {
  const GemvJob& j = *static_cast<const GemvJob*>(ctx);
  int64_t total = 0;
  for (int m = 0; m < j.count; ++m) total += (j.mats[m].L.rows + kQuad - 1) / kQuad;
  int64_t b, e;
  split(total, tid, nthreads, &b, &e);
  int64_t offset = 0;
  for (int m = 0; m < j.count; ++m) {
    const LinearRows& J = j.mats[m];
    const int64_t quads = (J.L.rows + kQuad - 1) / kQuad;
    const int64_t q0 = std::max<int64_t>(b - offset, 0), q1 = std::min<int64_t>(e - offset, quads);
    offset += quads;
    if (q0 >= q1) continue;
    if (J.L.bits == 4 && J.int4_mode == kSubnormal)
      gemv_quads_q_any<4, kSubnormal>(J, q0, q1);
    else if (J.L.bits == 4)
      gemv_quads_q_any<4>(J, q0, q1);
    else if (J.L.bits == 8)
      gemv_quads_q_any<8>(J, q0, q1);
    else if (j.dtype == 1)
      gemv_quads<uint16_t>(J, q0, q1);
    else
      gemv_quads<float>(J, q0, q1);
  }
}

// What int4 projections need of their input besides x, per token: its sums per group and,
// in kSubnormal mode, x * 2^kSubnormalXShift.
struct Int4Inputs {
  std::vector<float> xsum, x_shifted;
  std::vector<uint32_t> xb;  // quantized projections on the tiles: x as they read it (amx::build_x)
};

void gemv(Pool* pool, GemvJob& job, Int4Inputs& in) {
  int64_t sums = 0, shifted = 0;
  for (int m = 0; m < job.count; ++m)
    if (job.mats[m].L.bits == 4) {
      sums += job.mats[m].tokens * (job.mats[m].L.cols_p / job.mats[m].L.group_size);
      shifted += job.mats[m].tokens * job.mats[m].x_stride;
    }
  if (static_cast<int64_t>(in.xsum.size()) < sums) in.xsum.resize(static_cast<size_t>(sums));
  if (static_cast<int64_t>(in.x_shifted.size()) < shifted) in.x_shifted.resize(static_cast<size_t>(shifted));
  const int mode = g_int4_mode.load(std::memory_order_relaxed);
  int64_t sum_at = 0, shifted_at = 0;
  for (int m = 0; m < job.count; ++m) {
    LinearRows& J = job.mats[m];
    if (J.L.bits != 4) continue;
    const int64_t gs = J.L.group_size, groups = J.L.cols_p / gs, n = J.tokens * J.x_stride;
    const LinearRows* prev = m > 0 && job.mats[m - 1].L.bits == 4 ? &job.mats[m - 1] : nullptr;
    if (prev && prev->x == J.x && prev->L.group_size == gs && prev->L.cols_p == J.L.cols_p &&
        prev->tokens == J.tokens && prev->x_stride == J.x_stride) {  // q, k and v: the same input
      J.xsum = prev->xsum;
      J.x_shifted = prev->x_shifted;
      J.int4_mode = prev->int4_mode;
      continue;
    }
    float* xsum = in.xsum.data() + sum_at;
    for (int64_t t = 0; t < J.tokens; ++t) group_sums(J.x + t * J.x_stride, J.L.cols_p, gs, xsum + t * groups);
    J.xsum = xsum;
    J.int4_mode = mode;
    if (mode == kSubnormal) {
      // As the MoE step: x * 2^64 would overflow from |x| = 2^64 on; such inputs convert.
      float* xs = in.x_shifted.data() + shifted_at;
      const float shift = std::ldexp(1.0f, kSubnormalXShift);
      float largest = 0.0f;
      for (int64_t i = 0; i < n; ++i) {
        xs[i] = J.x[i] * shift;
        largest = std::max(largest, std::fabs(J.x[i]));
      }
      if (!(largest < 0x1p60f)) J.int4_mode = kConvert;
      J.x_shifted = xs;
    }
    sum_at += J.tokens * groups;
    shifted_at += n;
  }
#if defined(DEAMOE_AMX)
  // Quantized projections of kAmxMinTokens tokens or more take the tiles (deamoe_cpu.cpp, "AMX").
  if (g_amx_mode.load(std::memory_order_relaxed) == 1) {
    int64_t words = 0;
    auto amx_rows = [](const LinearRows& J) {
      return J.L.bits && J.tokens >= kAmxMinTokens && J.L.cols_p % 32 == 0 && J.L.group_size % 32 == 0;
    };
    auto tile_words = [](const LinearRows& J) { return J.tokens * (J.L.cols_p / 32) * 3 * 16; };
    for (int m = 0; m < job.count; ++m)
      if (amx_rows(job.mats[m])) words += tile_words(job.mats[m]);
    if (static_cast<int64_t>(in.xb.size()) < words) in.xb.resize(static_cast<size_t>(words));
    int64_t at = 0;
    for (int m = 0; m < job.count; ++m) {
      LinearRows& J = job.mats[m];
      if (!amx_rows(J)) continue;
      const LinearRows* prev = m > 0 ? &job.mats[m - 1] : nullptr;
      if (prev && prev->xb && prev->x == J.x && prev->L.cols_p == J.L.cols_p && prev->tokens == J.tokens &&
          prev->x_stride == J.x_stride) {  // q, k and v: the same input
        J.xb = prev->xb;
        continue;
      }
      uint32_t* xb = in.xb.data() + at;
      for (int64_t t0 = 0; t0 < J.tokens; t0 += kAmxTokens)
        amx::build_x(J.x + t0 * J.x_stride, J.x_stride, static_cast<int>(std::min<int64_t>(kAmxTokens, J.tokens - t0)),
                     J.L.cols_p, xb + t0 * (J.L.cols_p / 32) * 3 * 16);
      J.xb = xb;
      at += tile_words(J);
    }
  }
#endif
  if (pool->size() == 1)
    gemv_job(&job, 0, 1);
  else
    pool->run_slices(gemv_job, &job, step_slices(pool->size()));
}

// out = x * rsqrt(mean(x^2) + eps) * w over n values (Hugging Face's RMSNorm, fp32).
inline void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out) {
  // Eight independent sums (the compiler keeps them in one vector) rather than one chain.
  double part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) part[j] += static_cast<double>(x[i + j]) * x[i + j];
  for (; i < n; ++i) part[0] += static_cast<double>(x[i]) * x[i];
  double ss = 0.0;
  for (double p : part) ss += p;
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

// Llama's non-interleaved rotary: halves (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
inline void rotate(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace

extern "C" {

struct dm_lm_block {
  const float* input_norm;  // [d] fp32
  const float* post_norm;   // [d] fp32
  dm_lm_linear q, k, v, o;  // q [H*hd, dp], k and v [Hkv*hd, dp], o [d, round_up(H*hd)]
  const float* q_norm;      // qk_norm "head": [hd]; "full": [H*hd]; else null (fp32)
  const float* k_norm;      // likewise, [hd] or [Hkv*hd]
  const float* sinks;       // [H] fp32 sink logits, or null
  int64_t window;           // sliding window (0: every key)
  const dm_layer* ffn;      // the block's DeaMoE layer, or its dense MLP as a layer of one shared part
  int32_t dense;            // 1: ffn is a dense MLP (run without routing)
};

struct dm_lm {
  int32_t dtype;    // non-FFN weights: 0 fp32, 1 fp16
  int32_t qk_norm;  // 0 none, 1 per head, 2 over the whole projection
  int64_t vocab, d, dp, layers, heads, kv_heads, head_dim, max_context;
  float eps, clip_qkv, attention_scale, embedding_multiplier, residual_multiplier, logits_scaling;
  const void* embed;        // [vocab, dp], packed as a projection (dm_pack_linear)
  const float* final_norm;  // [d]
  dm_lm_linear head;        // [vocab, dp] (may be embed)
  const float* rope_cos;    // [max_context, hd / 2]
  const float* rope_sin;
  const dm_lm_block* blocks;  // [layers]
};

}  // extern "C"

namespace {

// One sequence: its position, KV caches and scratch; the weights are the caller's.
struct LmSession {
  dm_lm m;
  std::vector<dm_lm_block> blocks;
  Pool* pool;
  int64_t position = 0;
  int64_t capacity = 0;                // positions the full blocks' caches hold now
  std::vector<std::vector<float>> kc;  // per block: [slots, kv_heads, hd]
  std::vector<std::vector<float>> vc;
  std::vector<float> x, xn, q, k, v, attn, o, ffn, scores, scratch, router_logits, router_w;
  Int4Inputs int4;
  std::vector<int64_t> router_ids;
  int64_t experts = 1, top_k = 1;     // the largest router of the model's DeaMoE blocks
  std::vector<LmSession*> token_seq;  // per token of a call: its sequence and position
  std::vector<int64_t> token_pos;
};

void reserve(LmSession& s, int64_t positions) {
  if (positions <= s.capacity) return;
  int64_t cap = std::max<int64_t>(s.capacity, 64);
  while (cap < positions) cap *= 2;
  cap = std::min(cap, s.m.max_context);
  const int64_t kv = s.m.kv_heads * s.m.head_dim;
  for (int64_t l = 0; l < s.m.layers; ++l) {
    const int64_t window = s.blocks[l].window;
    // A ring must not change size once it wraps: it is made whole (window slots) at once.
    const int64_t n = window ? std::min(window, s.m.max_context) : cap;
    s.kc[l].resize(static_cast<size_t>(n * kv));
    s.vc[l].resize(static_cast<size_t>(n * kv));
  }
  s.scores.resize(static_cast<size_t>(s.m.heads * cap));
  s.capacity = cap;
}

struct AttentionJob {
  LmSession* s;
  int64_t layer, position;
  const float* q;  // [heads * hd] the query at position
  float* out;      // [heads * hd]
};

// A head's rows of the KV cache may come from DRAM: a step streams far more weights than the
// caches hold since they were last read. The scores ask for key j + kKvAhead's row ahead.
constexpr int64_t kKvAhead = 8;

inline void prefetch_row(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; i += 64 / sizeof(float)) _mm_prefetch(reinterpret_cast<const char*>(row + i), _MM_HINT_T0);
}

// sc[j - first] = (q . k_j) * scale for keys first..p, four keys at a time against q held in
// registers: one key at a time, each key's chain of multiply-adds and its horizontal sum
// left the core waiting (the same multiply-adds in the same order: the same bits).
template <int NV>
inline void key_scores(const float* q, const float* kc, int64_t kv_stride, int64_t first, int64_t p, int64_t ring,
                       float scale, float* sc) {
  V qv[NV];
  for (int i = 0; i < NV; ++i) qv[i] = vload(q + i * W);
  auto row = [&](int64_t j) { return kc + (ring ? j % ring : j) * kv_stride; };
  int64_t j = first;
  for (; j + 4 <= p + 1; j += 4) {
    const float *k0 = row(j), *k1 = row(j + 1), *k2 = row(j + 2), *k3 = row(j + 3);
    if (j + 4 + kKvAhead <= p + 1)
      for (int u = 0; u < 4; ++u) prefetch_row(row(j + kKvAhead + u), NV * W);
    V a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    for (int i = 0; i < NV; ++i) {
      a0 = vfma(qv[i], vload(k0 + i * W), a0);
      a1 = vfma(qv[i], vload(k1 + i * W), a1);
      a2 = vfma(qv[i], vload(k2 + i * W), a2);
      a3 = vfma(qv[i], vload(k3 + i * W), a3);
    }
    sc[j - first] = vsum(a0) * scale;
    sc[j + 1 - first] = vsum(a1) * scale;
    sc[j + 2 - first] = vsum(a2) * scale;
    sc[j + 3 - first] = vsum(a3) * scale;
  }
  for (; j <= p; ++j) {
    const float* k = row(j);
    V a = vzero();
    for (int i = 0; i < NV; ++i) a = vfma(qv[i], vload(k + i * W), a);
    sc[j - first] = vsum(a) * scale;
  }
}

// out = sum_j w_j v_j over keys first..p, the NV vectors of out in registers across the
// keys: through memory, each key's update of out waited for the previous key's store (the
// same multiply-adds in the same order: the same bits).
template <int NV>
inline void weighted_values(const float* vc, int64_t kv_stride, int64_t first, int64_t p, int64_t ring,
                            const float* weights, float scale, float* out) {
  V acc[NV];
  for (int i = 0; i < NV; ++i) acc[i] = vzero();
  for (int64_t j = first; j <= p; ++j) {
    const float* vj = vc + (ring ? j % ring : j) * kv_stride;
    const V w = vset1(weights[j - first] * scale);
    for (int i = 0; i < NV; ++i) acc[i] = vfma(w, vload(vj + i * W), acc[i]);
  }
  for (int i = 0; i < NV; ++i) vstore(out + i * W, acc[i]);
}

// Heads [h0, h1) of one query at position p: softmax(q k^T * scale [+ sink]) v.
void attention_heads(LmSession& s, int64_t layer, int64_t p, const float* query, float* output, int64_t h0,
                     int64_t h1) {
  const dm_lm& m = s.m;
  const dm_lm_block& B = s.blocks[layer];
  const int64_t hd = m.head_dim, kvh = m.kv_heads, groups = m.heads / m.kv_heads;
  const int64_t window = B.window;
  const int64_t first = window ? std::max<int64_t>(0, p - window + 1) : 0;
  const int64_t ring = window ? std::min(window, m.max_context) : 0;
  const float* kc = s.kc[layer].data();
  const float* vc = s.vc[layer].data();
  for (int64_t h = h0; h < h1; ++h) {
    const float* q = query + h * hd;
    const int64_t g = h / groups;
    float* sc = s.scores.data() + h * s.capacity;
    const int64_t keys = p - first + 1;
    const float* kg = kc + g * hd;
    for (int64_t j = first; j < std::min(first + kKvAhead, p + 1); ++j)
      prefetch_row(kg + (ring ? j % ring : j) * kvh * hd, hd);
    if (hd == 8 * W) {
      key_scores<8>(q, kg, kvh * hd, first, p, ring, m.attention_scale, sc);
    } else if (hd == 4 * W) {
      key_scores<4>(q, kg, kvh * hd, first, p, ring, m.attention_scale, sc);
    } else {
      for (int64_t j = first; j <= p; ++j) {
        const float* kj = kg + (ring ? j % ring : j) * kvh * hd;
        float dot = 0.0f;
        if (hd % W == 0) {
          V acc = vzero();
          for (int64_t i = 0; i < hd; i += W) acc = vfma(vload(q + i), vload(kj + i), acc);
          dot = vsum(acc);
        } else {
          for (int64_t i = 0; i < hd; ++i) dot += q[i] * kj[i];
        }
        sc[j - first] = dot * m.attention_scale;
      }
    }
    float top = -INFINITY;
    for (int64_t j = 0; j < keys; ++j) top = std::max(top, sc[j]);
    const float sink = B.sinks ? B.sinks[h] : -INFINITY;
    top = std::max(top, sink);
    float total = B.sinks ? std::exp(sink - top) : 0.0f;
    // exp(s - top) by the kernel's vector exp (within 2 ulp), the last keys in a vector
    // filled up with top (exp(0), not counted): a call of the C library's exp per key cost as
    // much as a vector of them.
    int64_t j = 0;
    V sum = vzero();
    for (; j + W <= keys; j += W) {
      const V e = vexp_neg(vsub(vset1(top), vload(sc + j)));
      vstore(sc + j, e);
      sum = vadd(sum, e);
    }
    total += vsum(sum);
    if (j < keys) {
      alignas(64) float rest[W];
      for (int64_t i = 0; i < W; ++i) rest[i] = j + i < keys ? sc[j + i] : top;
      vstore(rest, vexp_neg(vsub(vset1(top), vload(rest))));
      for (int64_t i = 0; j + i < keys; ++i) {
        sc[j + i] = rest[i];
        total += rest[i];
      }
    }
    float* out = output + h * hd;
    const float inv = 1.0f / total;
    const float* vg = vc + g * hd;
    if (hd == 8 * W) {
      weighted_values<8>(vg, kvh * hd, first, p, ring, sc, inv, out);
      continue;
    }
    if (hd == 4 * W) {
      weighted_values<4>(vg, kvh * hd, first, p, ring, sc, inv, out);
      continue;
    }
    std::fill(out, out + hd, 0.0f);
    for (int64_t j = first; j <= p; ++j) {
      const int64_t slot = ring ? j % ring : j;
      const float* vj = vc + (slot * kvh + g) * hd;
      const float pj = sc[j - first] * inv;
      if (hd % W == 0) {
        for (int64_t i = 0; i < hd; i += W) vstore(out + i, vfma(vset1(pj), vload(vj + i), vload(out + i)));
      } else {
        for (int64_t i = 0; i < hd; ++i) out[i] += pj * vj[i];
      }
    }
  }
}

void attention_job(void* ctx, int tid, int nthreads) {
  const AttentionJob& j = *static_cast<const AttentionJob*>(ctx);
  int64_t h0, h1;
  split(j.s->m.heads, tid, nthreads, &h0, &h1);
  attention_heads(*j.s, j.layer, j.position, j.q, j.out, h0, h1);
}

// Row id of the embedding, packed as a projection (the head may be the same matrix).
template <typename ET>
void embed_row(const dm_lm& m, int64_t id, float* x) {
  const ET* w = static_cast<const ET*>(m.embed) + (id / kQuad) * kQuad * m.dp + (id % kQuad) * W;
  for (int64_t i = 0; i < m.dp; i += W, w += kQuad * W) vstore(x + i, vmul(vload(w), vset1(m.embedding_multiplier)));
}

LinearRows rows_of(const dm_lm_linear& L, const float* x, int64_t x_stride, float* y, int64_t y_stride,
                   int64_t tokens) {
  return LinearRows{L, x, y, tokens, x_stride, y_stride, nullptr, nullptr, kConvert};
}

// Room for T tokens in the session's activations.
void reserve_tokens(LmSession& s, int64_t T) {
  const dm_lm& m = s.m;
  const int64_t qdp = (m.heads * m.head_dim + kPad - 1) / kPad * kPad, kvd = m.kv_heads * m.head_dim;
  if (static_cast<int64_t>(s.x.size()) >= T * m.dp) return;
  // Zero-filled: the padding columns of x, xn and attn stay zero.
  s.x.assign(static_cast<size_t>(T * m.dp), 0.0f);
  s.xn.assign(static_cast<size_t>(T * m.dp), 0.0f);
  s.q.assign(static_cast<size_t>(T * qdp), 0.0f);
  s.attn.assign(static_cast<size_t>(T * qdp), 0.0f);
  s.k.assign(static_cast<size_t>(T * kvd), 0.0f);
  s.v.assign(static_cast<size_t>(T * kvd), 0.0f);
  s.o.assign(static_cast<size_t>(T * m.d), 0.0f);
  s.ffn.assign(static_cast<size_t>(T * m.d), 0.0f);
  s.scratch.assign(static_cast<size_t>(step_slices(s.pool->size()) * T * m.dp), 0.0f);
  s.router_logits.assign(static_cast<size_t>(T * s.experts), 0.0f);
  s.router_ids.assign(static_cast<size_t>(T * s.top_k), 0);
  s.router_w.assign(static_cast<size_t>(T * s.top_k), 0.0f);
  s.token_seq.assign(static_cast<size_t>(T), nullptr);
  s.token_pos.assign(static_cast<size_t>(T), 0);
}

// Heads of a batched step's queries, one query per sequence: (token, head) pairs split over
// the threads. Every token's sequence is a different one, so no two pairs share a cache or
// a scores row.
struct BatchAttentionJob {
  LmSession* const* seqs;
  const int64_t* pos;
  int64_t layer, tokens, q_stride;
  const float* q;
  float* out;
};

void batch_attention_job(void* ctx, int tid, int nthreads) {
  const BatchAttentionJob& j = *static_cast<const BatchAttentionJob*>(ctx);
  const int64_t heads = j.seqs[0]->m.heads;
  int64_t b, e;
  split(j.tokens * heads, tid, nthreads, &b, &e);
  for (int64_t i = b; i < e;) {
    const int64_t t = i / heads, h0 = i % heads, h1 = std::min(heads, h0 + (e - i));
    attention_heads(*j.seqs[t], j.layer, j.pos[t], j.q + t * j.q_stride, j.out + t * j.q_stride, h0, h1);
    i += h1 - h0;
  }
}

// T tokens, token t of sequence seqs[t] at position pos[t], each projection streamed once for
// all of them: a prompt (one sequence at consecutive positions) or a batched step (one token
// of each of T different sequences: `distinct`). `work` holds the activations (reserve_tokens
// for T). Logits: rows 1, the last token's [vocab]; rows T, every token's [T, vocab]; none
// when null. The sequences' positions are the caller's to advance.
void lm_tokens(LmSession& work, LmSession* const* seqs, const int64_t* pos, bool distinct, const int64_t* ids,
               int64_t T, float* logits, int64_t rows) {
  LmSession& s = work;
  const dm_lm& m = s.m;
  const int64_t d = m.d, dp = m.dp, hd = m.head_dim, half = hd / 2;
  const int64_t qd = m.heads * hd, kvd = m.kv_heads * hd, qdp = (qd + kPad - 1) / kPad * kPad;
  float* x = s.x.data();
  float* xn = s.xn.data();
  for (int64_t t = 0; t < T; ++t) {
    if (m.dtype == 1)
      embed_row<uint16_t>(m, ids[t], x + t * dp);
    else
      embed_row<float>(m, ids[t], x + t * dp);
  }
  for (int64_t l = 0; l < m.layers; ++l) {
    const dm_lm_block& B = s.blocks[l];
    for (int64_t t = 0; t < T; ++t) rms_norm(x + t * dp, B.input_norm, d, m.eps, xn + t * dp);
    GemvJob qkv{m.dtype,
                3,
                {rows_of(B.q, xn, dp, s.q.data(), qdp, T), rows_of(B.k, xn, dp, s.k.data(), kvd, T),
                 rows_of(B.v, xn, dp, s.v.data(), kvd, T)}};
    gemv(s.pool, qkv, s.int4);
    int64_t keys = 0;  // the batch's attention work, to decide whether the pool runs it
    for (int64_t t = 0; t < T; ++t) {
      const int64_t p = pos[t];
      LmSession& seq = *seqs[t];
      float *q = s.q.data() + t * qdp, *k = s.k.data() + t * kvd, *v = s.v.data() + t * kvd;
      if (m.qk_norm == 2) {
        rms_norm(q, B.q_norm, qd, m.eps, q);
        rms_norm(k, B.k_norm, kvd, m.eps, k);
      }
      if (m.clip_qkv > 0) {
        for (float* u : {q, k, v}) {
          const int64_t n = u == q ? qd : kvd;
          for (int64_t i = 0; i < n; ++i) u[i] = std::min(std::max(u[i], -m.clip_qkv), m.clip_qkv);
        }
      }
      if (m.qk_norm == 1) {
        for (int64_t h = 0; h < m.heads; ++h) rms_norm(q + h * hd, B.q_norm, hd, m.eps, q + h * hd);
        for (int64_t h = 0; h < m.kv_heads; ++h) rms_norm(k + h * hd, B.k_norm, hd, m.eps, k + h * hd);
      }
      const float* cos = m.rope_cos + p * half;
      const float* sin = m.rope_sin + p * half;
      for (int64_t h = 0; h < m.heads; ++h) rotate(q + h * hd, cos, sin, half);
      for (int64_t h = 0; h < m.kv_heads; ++h) rotate(k + h * hd, cos, sin, half);
      const int64_t slot = B.window ? p % std::min(B.window, m.max_context) : p;
      std::memcpy(seq.kc[l].data() + slot * kvd, k, static_cast<size_t>(kvd) * sizeof(float));
      std::memcpy(seq.vc[l].data() + slot * kvd, v, static_cast<size_t>(kvd) * sizeof(float));
      keys += p + 1;
      if (distinct) continue;  // attention once every sequence's key is in its cache (below)
      // A prompt's tokens one by one: a sliding block's ring may reuse a slot an earlier token still reads.
      AttentionJob aj{&seq, l, p, q, s.attn.data() + t * qdp};
      // Few keys: the pool's fork/join would cost more than the heads.
      if (s.pool->size() == 1 || (p + 1) * m.heads * hd < 65536)
        attention_job(&aj, 0, 1);
      else
        s.pool->run_slices(attention_job, &aj, step_slices(s.pool->size()));
    }
    if (distinct) {
      BatchAttentionJob bj{seqs, pos, l, T, qdp, s.q.data(), s.attn.data()};
      if (s.pool->size() == 1 || keys * m.heads * hd < 65536)
        batch_attention_job(&bj, 0, 1);
      else
        s.pool->run_slices(batch_attention_job, &bj, step_slices(s.pool->size()));
    }
    GemvJob out{m.dtype, 1, {rows_of(B.o, s.attn.data(), qdp, s.o.data(), d, T)}};
    gemv(s.pool, out, s.int4);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < d; ++i) x[t * dp + i] += m.residual_multiplier * s.o[t * d + i];
      rms_norm(x + t * dp, B.post_norm, d, m.eps, xn + t * dp);
    }
    float* y = s.ffn.data();  // [T, d]
    if (B.dense) {
      run_step(s.pool, *B.ffn, xn, T, s.router_ids.data(), s.router_w.data(), nullptr, y, s.scratch.data());
    } else {
      dm_layer_forward(s.pool, B.ffn, xn, T, y, s.scratch.data(), s.router_logits.data(), s.router_ids.data(),
                       s.router_w.data());
    }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < d; ++i) x[t * dp + i] += m.residual_multiplier * y[t * d + i];
  }
  if (!logits) return;
  const int64_t first = T - rows;
  for (int64_t t = first; t < T; ++t) rms_norm(x + t * dp, m.final_norm, d, m.eps, xn + t * dp);
  GemvJob head{m.dtype, 1, {rows_of(m.head, xn + first * dp, dp, logits, m.vocab, rows)}};
  gemv(s.pool, head, s.int4);
  if (m.logits_scaling != 1.0f)
    for (int64_t i = 0; i < rows * m.vocab; ++i) logits[i] /= m.logits_scaling;
}

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

bool valid_linear(const dm_lm_linear& L) {
  if (!L.w || L.rows < 1 || L.cols_p < 1 || L.cols_p % kPad) return false;
  if (L.bits == 0) return true;
  return (L.bits == 4 || L.bits == 8) && L.group_size > 0 && L.group_size % W == 0 && L.cols_p % L.group_size == 0 &&
         valid_scale_dtype(L.scale_dtype);
}

bool valid_lm(const dm_lm& m) {
  if (m.dtype != 0 && m.dtype != 1) return false;
  if (m.vocab < 1 || m.d < 1 || m.dp < m.d || m.dp % kPad || m.layers < 1 || m.heads < 1 || m.kv_heads < 1 ||
      m.heads % m.kv_heads || m.head_dim < 2 || m.head_dim % 2 || m.max_context < 1)
    return false;
  if (m.qk_norm < 0 || m.qk_norm > 2 || !m.embed || !m.final_norm || !m.head.w || !m.rope_cos || !m.rope_sin ||
      !m.blocks)
    return false;
  if (m.head.rows != m.vocab || m.head.cols_p != m.dp || !valid_linear(m.head)) return false;
  const int64_t qd = m.heads * m.head_dim, kvd = m.kv_heads * m.head_dim;
  for (int64_t l = 0; l < m.layers; ++l) {
    const dm_lm_block& B = m.blocks[l];
    if (!B.input_norm || !B.post_norm || !B.ffn || B.window < 0) return false;
    if (B.q.rows != qd || B.k.rows != kvd || B.v.rows != kvd || B.o.rows != m.d) return false;
    if (B.q.cols_p != m.dp || B.k.cols_p != m.dp || B.v.cols_p != m.dp || B.o.cols_p != round_up(qd, kPad))
      return false;
    if (!valid_linear(B.q) || !valid_linear(B.k) || !valid_linear(B.v) || !valid_linear(B.o)) return false;
    if (m.qk_norm && (!B.q_norm || !B.k_norm)) return false;
    if (B.ffn->d != m.d || B.ffn->dp != m.dp || (!B.dense && !valid(*B.ffn))) return false;
  }
  return true;
}

}  // namespace

extern "C" {

// Elements of a float projection of rows x cols_p packed by dm_pack_linear.
int64_t dm_pack_linear_elems(int64_t rows, int64_t cols_p) { return quad_elems(rows, cols_p); }

// Pack a float projection (see gemv_quads): src [rows, cols] row-major, element size esize
// (4 fp32 / 2 fp16: bits are copied as they are); columns zero-padded to cols_p.
int dm_pack_linear(const void* src, int64_t rows, int64_t cols, int64_t cols_p, int esize, void* out) {
  if (rows < 1 || cols < 1 || cols_p < cols || cols_p % kPad || (esize != 2 && esize != 4)) return -1;
  auto* dst = static_cast<char*>(out);
  std::memset(dst, 0, static_cast<size_t>(quad_elems(rows, cols_p) * esize));
  for (int64_t row = 0; row < rows; ++row) {
    char* quad = dst + (row / kQuad) * kQuad * cols_p * esize;
    const char* from = static_cast<const char*>(src) + row * cols * esize;
    for (int64_t c = 0; c < cols; c += W) {
      const int64_t len = std::min<int64_t>(W, cols - c);
      std::memcpy(quad + ((c / W) * kQuad + row % kQuad) * W * esize, from + c * esize, len * esize);
    }
  }
  return 0;
}

// Bytes of a quantized projection of rows x cols packed by dm_pack_linear_q.
int64_t dm_pack_linear_q_bytes(int64_t rows, int64_t cols, int64_t gs, int bits, int scale_dtype) {
  return (rows + kQuad - 1) / kQuad * q_quad_bytes(bits, cols, gs, scale_dtype);
}

// Pack a quantized projection (see q_quad_bytes): codes [rows, cols] unsigned, one per byte;
// scales [rows, cols / gs] fp32, stored as scale_dtype. cols a whole number of groups, gs a
// multiple of the vector width. -1: bad arguments; -2: a scale that scale_dtype cannot hold
// exactly (nothing of the kind is rounded).
int dm_pack_linear_q(const uint8_t* codes, const float* scales, int scale_dtype, int64_t rows, int64_t cols, int64_t gs,
                     int bits, void* out) {
  if ((bits != 4 && bits != 8) || rows < 1 || cols < 1 || gs < 1 || gs % W || cols % gs) return -1;
  if (!valid_scale_dtype(scale_dtype)) return -1;
  const int64_t groups = cols / gs, quads = (rows + kQuad - 1) / kQuad, sbytes = scale_bytes(scale_dtype);
  const int64_t group_bytes = q_group_bytes(bits, gs, scale_dtype), chunk_bytes = bits == 4 ? 2 * W : kQuad * W;
  auto* dst = static_cast<uint8_t*>(out);
  std::memset(dst, 0, static_cast<size_t>(quads * groups * group_bytes));
  for (int64_t quad = 0; quad < quads; ++quad)
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* base = dst + (quad * groups + g) * group_bytes;
      for (int r = 0; r < kQuad; ++r) {
        const int64_t row = quad * kQuad + r;
        if (row >= rows) continue;  // zero scale and codes: the padding row adds nothing
        if (!store_scale(scales[row * groups + g], scale_dtype, base + r * sbytes)) return -2;
        for (int64_t c = 0; c < gs; ++c) {
          uint8_t* chunk = base + kQuad * sbytes + (c / W) * chunk_bytes;
          const int64_t i = c % W;
          const uint8_t v = codes[row * cols + g * gs + c];
          if (bits == 8)
            chunk[r * W + i] = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(v) - 128));
          else  // lane i (2 bytes), bits 4r..4r+3
            chunk[2 * i + r / 2] |= static_cast<uint8_t>((v & 15) << (4 * (r % 2)));
        }
      }
    }
  return 0;
}

// A sequence of the model m on pool (its weights must outlive it); null on bad arguments.
void* dm_lm_create(const dm_lm* m, void* pool) {
  if (!m || !pool || !valid_lm(*m)) return nullptr;
  try {
    auto* s = new LmSession();
    s->m = *m;
    s->blocks.assign(m->blocks, m->blocks + m->layers);
    s->pool = static_cast<Pool*>(pool);
    s->kc.resize(static_cast<size_t>(m->layers));
    s->vc.resize(static_cast<size_t>(m->layers));
    for (int64_t l = 0; l < m->layers; ++l) {
      const dm_lm_block& B = m->blocks[l];
      if (B.dense) continue;
      s->experts = std::max(s->experts, B.ffn->num_departments * B.ffn->experts_per_department);
      s->top_k = std::max(s->top_k, B.ffn->top_k);
    }
    reserve_tokens(*s, 1);
    return s;
  } catch (...) {
    return nullptr;
  }
}

void dm_lm_destroy(void* session) { delete static_cast<LmSession*>(session); }

int64_t dm_lm_position(void* session) { return static_cast<LmSession*>(session)->position; }

// Forget the sequence (the cache's memory is kept for the next one).
void dm_lm_reset(void* session) { static_cast<LmSession*>(session)->position = 0; }

// Feed `tokens` ids at the session's position, all through each block together; logits
// [vocab] of the last one (fp32). -2: the context would overflow; -3: an id outside the vocabulary; -4: out of
// memory. Nothing changes on an error.
int dm_lm_forward(void* session, const int64_t* ids, int64_t tokens, float* logits) {
  auto& s = *static_cast<LmSession*>(session);
  if (tokens < 1 || !ids || !logits) return -1;
  if (s.position + tokens > s.m.max_context) return -2;
  for (int64_t t = 0; t < tokens; ++t)
    if (ids[t] < 0 || ids[t] >= s.m.vocab) return -3;
  try {
    reserve(s, s.position + tokens);
    reserve_tokens(s, tokens);
  } catch (...) {
    return -4;
  }
  for (int64_t t = 0; t < tokens; ++t) {
    s.token_seq[t] = &s;
    s.token_pos[t] = s.position + t;
  }
  lm_tokens(s, s.token_seq.data(), s.token_pos.data(), false, ids, tokens, logits, 1);
  s.position += tokens;
  return 0;
}

// One token for each of n sequences (sessions of dm_lm_create over one model and pool, each
// named once) in one step: every weight is read once for all n, each token attends over its
// own sequence's cache at its own position. logits [n, vocab] fp32, row i for sessions[i].
// -1: bad arguments; -2: a sequence's context would overflow; -3: an id outside the
// vocabulary; -4: out of memory; -5: a session named twice or of another model. Nothing
// changes on an error.
int dm_lm_forward_batch(void* const* sessions, const int64_t* ids, int64_t n, float* logits) {
  if (n < 1 || !sessions || !ids || !logits) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (!sessions[i]) return -1;
  auto& work = *static_cast<LmSession*>(sessions[0]);
  for (int64_t i = 0; i < n; ++i) {
    const auto& s = *static_cast<const LmSession*>(sessions[i]);
    if (s.m.blocks != work.m.blocks || s.m.embed != work.m.embed || s.pool != work.pool) return -5;
    for (int64_t j = 0; j < i; ++j)
      if (sessions[j] == sessions[i]) return -5;
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto& s = *static_cast<const LmSession*>(sessions[i]);
    if (s.position + 1 > s.m.max_context) return -2;
    if (ids[i] < 0 || ids[i] >= s.m.vocab) return -3;
  }
  try {
    for (int64_t i = 0; i < n; ++i) {
      auto& s = *static_cast<LmSession*>(sessions[i]);
      reserve(s, s.position + 1);
    }
    reserve_tokens(work, n);
  } catch (...) {
    return -4;
  }
  for (int64_t i = 0; i < n; ++i) {
    work.token_seq[i] = static_cast<LmSession*>(sessions[i]);
    work.token_pos[i] = work.token_seq[i]->position;
  }
  lm_tokens(work, work.token_seq.data(), work.token_pos.data(), true, ids, n, logits, n);
  for (int64_t i = 0; i < n; ++i) static_cast<LmSession*>(sessions[i])->position += 1;
  return 0;
}

}  // extern "C"
