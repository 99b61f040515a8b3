// int4_awq's projection on AVX512-BF16 dot products: y = x Wᵀ with W = (q - 8) * scale + zero per (row, group).
//
// ATen's _weight_int4pack_mm_for_cpu dequantises every weight to float32 and multiplies with float32 FMAs (16
// multiply-adds an instruction); at 16 rows a decode step is compute-bound on them. Here the factor is split:
//   Σ_k x_k w_k = scale · Σ_k x_k (q_k - 8) + zero · Σ_k x_k        (per group of inputs)
// q - 8 is an integer in [-8, 7], exact in bf16, and x is bf16 already, so VDPBF16PS (32 multiply-adds an instruction)
// computes Σ x (q - 8) with exact products, accumulated in float32. The weights are not rounded to bf16 (which
// changes the default model's answers: bench/engine_notes.md); the result differs from ATen's only in the order of
// float32 roundings.
//
// Layout (int4_pack), per block of 16 output rows n0..n0+15 (as ATen's int4 kernel, whole blocks only), per step of
// 4 inputs k..k+3, 32 bytes: byte 2c + j holds q[n0 + c, k + j] in its low nibble and q[n0 + c, k + 2 + j] in its
// high one. Widened to 16-bit lanes, a low-nibble lookup gives lane pairs (k, k+1) of the 16 rows and a high-nibble
// lookup pairs (k+2, k+3): exactly VDPBF16PS's operand, against the broadcast pair of inputs. Scales and zeros are
// bf16 [blocks, groups, 2, 16].
//
// Prompt steps (int4_linear_f32) read the same layout and reproduce ATen's numbers bit for bit: a prompt's first token
// comes from them, and the default model's first answer is a near tie that the dot products' order flips
// (bench/engine_notes.md). So one copy of the weights serves both steps.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include "lanes.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace {

using c10::BFloat16;

constexpr int64_t kLanes = 16;  // output rows of a block
constexpr int64_t kStep = 4;    // inputs of a 32-byte step
constexpr int kRowTile = 6;     // input rows whose sums stay in registers (6 × 2 blocks × 2 sums + 4 weights ≤ 32)

bool has_avx512_bf16() {
  static const bool yes = llm_cpu_kernels::has_avx512() && __builtin_cpu_supports("avx512bf16");
  return yes;
}

// bf16 bit patterns of q - 8 for q = 0..15 (small integers: the float's upper half, exactly).
uint16_t bf16_of_offset(int q) {
  const float v = static_cast<float>(q - 8);
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

// The lookup of unpack_step: 32 lanes, index = q (the upper 16 repeat the lower: only 5 index bits are read).
const uint16_t* offset_table() {
  static const struct Table {
    uint16_t lanes[32];
    Table() { for (int q = 0; q < 32; ++q) lanes[q] = bf16_of_offset(q & 15); }
  } table;
  return table.lanes;
}

__attribute__((target("avx512f,avx512bw,avx512bf16")))
inline void unpack_step(const uint8_t* bytes, __m512i lut, __m512bh& low, __m512bh& high) {
  const __m512i wide = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
  low = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(wide, _mm512_set1_epi16(15)), lut);
  high = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(wide, 4), lut);
}

// Rows m0..m0+Rows-1 by blocks b0..b0+Blocks-1: every group's dot products, then scale and zero into the totals.
template <int Rows, int Blocks>
__attribute__((target("avx512f,avx512bw,avx512bf16")))
void tile(const BFloat16* x, const float* row_sums, const uint8_t* packed, const BFloat16* scales_zeros,
          int64_t k_len, int64_t group, int64_t b0, int64_t m0, int64_t n_len, BFloat16* out) {
  const int64_t groups = k_len / group, block_bytes = k_len / kStep * 32;
  const __m512i lut = _mm512_loadu_si512(offset_table());
  __m512 total[Rows][Blocks];
  for (int r = 0; r < Rows; ++r)
    for (int b = 0; b < Blocks; ++b) total[r][b] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 dot[Rows][Blocks];
    for (int r = 0; r < Rows; ++r)
      for (int b = 0; b < Blocks; ++b) dot[r][b] = _mm512_setzero_ps();
    for (int64_t k = g * group; k < (g + 1) * group; k += kStep) {
      __m512bh low[Blocks], high[Blocks];
      for (int b = 0; b < Blocks; ++b) unpack_step(packed + (b0 + b) * block_bytes + k / kStep * 32, lut, low[b], high[b]);
      for (int r = 0; r < Rows; ++r) {
        const BFloat16* row = x + (m0 + r) * k_len + k;
        int32_t pair01, pair23;
        std::memcpy(&pair01, row, 4);
        std::memcpy(&pair23, row + 2, 4);
        const __m512bh a01 = (__m512bh)_mm512_set1_epi32(pair01), a23 = (__m512bh)_mm512_set1_epi32(pair23);
        for (int b = 0; b < Blocks; ++b) {
          dot[r][b] = _mm512_dpbf16_ps(dot[r][b], low[b], a01);
          dot[r][b] = _mm512_dpbf16_ps(dot[r][b], high[b], a23);
        }
      }
    }
    for (int b = 0; b < Blocks; ++b) {
      const BFloat16* sz = scales_zeros + ((b0 + b) * groups + g) * 2 * kLanes;
      const __m512 scale = llm_cpu_kernels::load16(sz), zero = llm_cpu_kernels::load16(sz + kLanes);
      for (int r = 0; r < Rows; ++r) {
        total[r][b] = _mm512_fmadd_ps(dot[r][b], scale, total[r][b]);
        total[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(row_sums[(m0 + r) * groups + g]), zero, total[r][b]);
      }
    }
  }
  for (int r = 0; r < Rows; ++r) {
    for (int b = 0; b < Blocks; ++b) {
      const int64_t n0 = (b0 + b) * kLanes;
      llm_cpu_kernels::store16(out + (m0 + r) * n_len + n0, total[r][b]);
    }
  }
}

template <int Blocks>
void rows_of_blocks(const BFloat16* x, const float* row_sums, const uint8_t* packed, const BFloat16* sz, int64_t m_len,
                    int64_t k_len, int64_t group, int64_t b0, int64_t n_len, BFloat16* out) {
  int64_t m0 = 0;
  for (; m0 + kRowTile <= m_len; m0 += kRowTile)
    tile<kRowTile, Blocks>(x, row_sums, packed, sz, k_len, group, b0, m0, n_len, out);
  switch (m_len - m0) {
    case 5: tile<5, Blocks>(x, row_sums, packed, sz, k_len, group, b0, m0, n_len, out); break;
    case 4: tile<4, Blocks>(x, row_sums, packed, sz, k_len, group, b0, m0, n_len, out); break;
    case 3: tile<3, Blocks>(x, row_sums, packed, sz, k_len, group, b0, m0, n_len, out); break;
    case 2: tile<2, Blocks>(x, row_sums, packed, sz, k_len, group, b0, m0, n_len, out); break;
    case 1: tile<1, Blocks>(x, row_sums, packed, sz, k_len, group, b0, m0, n_len, out); break;
    default: break;
  }
}

// Σ x over each (row, group) in float32: the zero's factor. Summed as ATen's sum(dtype=float) sums a group of 16 or
// 32 on AVX-512 (eight running sums over every eighth input, then added in order), so a decode step's numbers are
// those of the tensor op this loop replaces; calling that op cost ~7 µs a projection (a tenth of a batch-1 step).
void group_sums(const BFloat16* x, int64_t count, int64_t group, float* sums) {
  for (int64_t i = 0; i < count; ++i) {
    const BFloat16* in = x + i * group;
    float acc[8] = {};
    int64_t k = 0;
    for (; k + 8 <= group; k += 8)
      for (int j = 0; j < 8; ++j) acc[j] += static_cast<float>(in[k + j]);
    for (int j = 0; k + j < group; ++j) acc[j] += static_cast<float>(in[k + j]);
    float total = acc[0];
    for (int j = 1; j < 8; ++j) total += acc[j];
    sums[i] = total;
  }
}

void check_layout(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_zeros, int64_t group,
                  int64_t out_features) {
  const int64_t k_len = x.size(-1), blocks = packed.size(0);
  TORCH_CHECK(has_avx512_bf16(), "int4_linear needs AVX512-BF16 (int4_supported() says where it runs)");
  TORCH_CHECK(group > 0 && group % kStep == 0 && k_len % group == 0, "int4_linear: ", k_len,
              " inputs are not whole groups of ", group);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2 &&
              packed.size(1) == k_len / kStep * 32 && blocks * kLanes == out_features,
              "int4_linear: packed must be int4_pack's uint8 [", out_features / kLanes, ", ", k_len / kStep * 32, "]");
  TORCH_CHECK(scales_zeros.scalar_type() == at::kBFloat16 && scales_zeros.is_contiguous() &&
              scales_zeros.numel() == blocks * (k_len / group) * 2 * kLanes,
              "int4_linear: scales_zeros must be int4_pack's bf16 [blocks, groups, 2, 16]");
}

at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_zeros, int64_t group,
                       int64_t out_features) {
  check_layout(x, packed, scales_zeros, group, out_features);
  const int64_t k_len = x.size(-1), blocks = packed.size(0);
  const at::Tensor rows = x.reshape({-1, k_len}).to(at::kBFloat16).contiguous();
  const int64_t m_len = rows.size(0);
  at::Tensor out = at::empty({m_len, out_features}, rows.options());
  const BFloat16* xp = rows.data_ptr<BFloat16>();
  std::vector<float> row_sums(m_len * (k_len / group));
  group_sums(xp, m_len * k_len / group, group, row_sums.data());
  const float* sums = row_sums.data();
  const uint8_t* pp = packed.data_ptr<uint8_t>();
  const BFloat16* szp = scales_zeros.data_ptr<BFloat16>();
  BFloat16* op = out.data_ptr<BFloat16>();
  const int64_t pairs = blocks / 2;  // two blocks a task; an odd last block alone
  at::parallel_for(0, pairs + blocks % 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      if (p < pairs) rows_of_blocks<2>(xp, sums, pp, szp, m_len, k_len, group, 2 * p, out_features, op);
      else rows_of_blocks<1>(xp, sums, pp, szp, m_len, k_len, group, 2 * p, out_features, op);
    }
  });
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features;
  return out.view(shape);
}

// q [N, K] uint8 in 0..15, scales and zeros [N, K / group] → (packed, scales_zeros) in the layout above.
std::tuple<at::Tensor, at::Tensor> int4_pack(const at::Tensor& q, const at::Tensor& scales, const at::Tensor& zeros,
                                             int64_t group) {
  TORCH_CHECK(q.scalar_type() == at::kByte && q.dim() == 2, "int4_pack: q must be uint8 [out, in]");
  const int64_t n_len = q.size(0), k_len = q.size(1), groups = scales.size(1);
  TORCH_CHECK(n_len % kLanes == 0 && group % kStep == 0 && groups * group == k_len &&
              scales.sizes() == zeros.sizes() && scales.size(0) == n_len,
              "int4_pack: out must be a multiple of 16, scales and zeros [out, in / group] with group % 4 == 0");
  const int64_t blocks = n_len / kLanes;
  const at::Tensor qc = q.contiguous();
  const at::Tensor s = scales.to(at::kBFloat16).contiguous(), z = zeros.to(at::kBFloat16).contiguous();
  at::Tensor packed = at::empty({blocks, k_len / kStep * 32}, q.options());
  at::Tensor sz = at::empty({blocks, groups, 2, kLanes}, q.options().dtype(at::kBFloat16));
  const uint8_t* src = qc.data_ptr<uint8_t>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  const BFloat16 *sp = s.data_ptr<BFloat16>(), *zp = z.data_ptr<BFloat16>();
  BFloat16* szp = sz.data_ptr<BFloat16>();
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t c = 0; c < kLanes; ++c) {
        const int64_t n = b * kLanes + c;
        const uint8_t* qrow = src + n * k_len;
        for (int64_t k = 0; k < k_len; k += kStep) {
          uint8_t* step = dst + b * (k_len / kStep * 32) + k / kStep * 32;
          for (int64_t j = 0; j < 2; ++j)
            step[2 * c + j] = static_cast<uint8_t>((qrow[k + j] & 15) | ((qrow[k + 2 + j] & 15) << 4));
        }
        for (int64_t g = 0; g < groups; ++g) {
          szp[((b * groups + g) * 2) * kLanes + c] = sp[n * groups + g];
          szp[((b * groups + g) * 2 + 1) * kLanes + c] = zp[n * groups + g];
        }
      }
    }
  });
  return {packed, sz};
}

// ATen's _weight_int4pack_mm_for_cpu (AVX-512) in float32: each weight dequantised as fma(q - 8, scale, zero), each
// output one accumulator over k = 0..K-1 in order, acc = fma(x_k, w_k, acc), rounded to bf16 once. ATen dequantises
// a weight again for every 4 input rows; here, from 9 rows, a block pair's K × 32 weights are dequantised once into a
// buffer and every row runs over it.

// One block's weights in float32, a step of 4 inputs at a time, in order of k.
class BlockDequantiser {
 public:
  __attribute__((target("avx512f,avx512bw")))
  BlockDequantiser(const uint8_t* packed, const BFloat16* scales_zeros, int64_t group)
      : packed_(packed), scales_zeros_(scales_zeros), group_(group),
        evens_first_(_mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                      0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)),
        offsets_(_mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)) {}

  // w[i]: input k + i's weights of the block's 16 rows (k a multiple of 4; calls in increasing k from 0). Inlined
  // into the loops, so the scale and zero stay in registers.
  __attribute__((target("avx512f,avx512bw"), always_inline))
  inline void step(int64_t k, __m512 w[kStep]) {
    if (k % group_ == 0) {
      scale_ = llm_cpu_kernels::load16(scales_zeros_ + k / group_ * 2 * kLanes);
      zero_ = llm_cpu_kernels::load16(scales_zeros_ + k / group_ * 2 * kLanes + kLanes);
    }
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed_ + k / kStep * 32));
    v = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, evens_first_), 0b11011000);
    for (int j = 0; j < 2; ++j) {
      const __m512i q = _mm512_cvtepu8_epi32(j == 0 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1));
      w[j] = _mm512_fmadd_ps(_mm512_permutexvar_ps(q, offsets_), scale_, zero_);
      w[2 + j] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), offsets_), scale_, zero_);
    }
  }

 private:
  const uint8_t* packed_;
  const BFloat16* scales_zeros_;
  int64_t group_;
  // A step's bytes 2c + j reordered j-major (even bytes, then odd, within each 16-byte half; then the halves'
  // quarters), so that widening 16 of them gives q[c, k + j] (low nibbles) and q[c, k + 2 + j] (high) for c = 0..15.
  __m256i evens_first_;
  __m512 offsets_;  // float(q - 8) for q = 0..15, looked up by a lane's low 4 bits (as ATen's kernel does)
  __m512 scale_, zero_;
};

// A block's K × 16 weights into w (input k's at w + k * stride).
__attribute__((target("avx512f,avx512bw")))
void dequantise_block(const uint8_t* packed, const BFloat16* scales_zeros, int64_t group, int64_t k_len, float* w,
                      int64_t stride) {
  BlockDequantiser block(packed, scales_zeros, group);
  __m512 step[kStep];
  for (int64_t k = 0; k < k_len; k += kStep) {
    block.step(k, step);
    for (int i = 0; i < kStep; ++i) _mm512_storeu_ps(w + (k + i) * stride, step[i]);
  }
}

// Rows m0.. over a block pair's dequantised weights (w: [K, Blocks × 16]).
template <int Rows, int Blocks>
__attribute__((target("avx512f,avx512bw")))
void f32_tile(const float* x, const float* w, int64_t k_len, int64_t m0, int64_t n0, int64_t n_len, BFloat16* out) {
  __m512 acc[Rows][Blocks];
  for (int r = 0; r < Rows; ++r)
    for (int b = 0; b < Blocks; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_len; ++k) {
    __m512 wk[Blocks];
    for (int b = 0; b < Blocks; ++b) wk[b] = _mm512_loadu_ps(w + k * Blocks * kLanes + b * kLanes);
    for (int r = 0; r < Rows; ++r) {
      const __m512 xk = _mm512_set1_ps(x[(m0 + r) * k_len + k]);
      for (int b = 0; b < Blocks; ++b) acc[r][b] = _mm512_fmadd_ps(xk, wk[b], acc[r][b]);
    }
  }
  for (int r = 0; r < Rows; ++r)
    for (int b = 0; b < Blocks; ++b) llm_cpu_kernels::store16(out + (m0 + r) * n_len + n0 + b * kLanes, acc[r][b]);
}

template <int Blocks>
void f32_rows(const float* x, const float* w, int64_t m_len, int64_t k_len, int64_t n0, int64_t n_len, BFloat16* out) {
  int64_t m0 = 0;
  for (; m0 + 12 <= m_len; m0 += 12) f32_tile<12, Blocks>(x, w, k_len, m0, n0, n_len, out);
  if (m_len - m0 >= 8) { f32_tile<8, Blocks>(x, w, k_len, m0, n0, n_len, out); m0 += 8; }
  if (m_len - m0 >= 4) { f32_tile<4, Blocks>(x, w, k_len, m0, n0, n_len, out); m0 += 4; }
  if (m_len - m0 >= 2) { f32_tile<2, Blocks>(x, w, k_len, m0, n0, n_len, out); m0 += 2; }
  if (m_len - m0 == 1) f32_tile<1, Blocks>(x, w, k_len, m0, n0, n_len, out);
}

// A few rows (short prompt steps): weights dequantised in registers as they are used, as ATen does, since storing
// them costs more than these rows' multiply-adds.
template <int Rows>
__attribute__((target("avx512f,avx512bw")))
void f32_few_rows(const uint8_t* packed, const BFloat16* scales_zeros, int64_t group, const float* x, int64_t k_len,
                  int64_t n0, int64_t n_len, BFloat16* out) {
  BlockDequantiser block(packed, scales_zeros, group);
  __m512 acc[Rows], step[kStep];
  for (int r = 0; r < Rows; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_len; k += kStep) {
    block.step(k, step);
    for (int i = 0; i < kStep; ++i)
      for (int r = 0; r < Rows; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * k_len + k + i]), step[i], acc[r]);
  }
  for (int r = 0; r < Rows; ++r) llm_cpu_kernels::store16(out + r * n_len + n0, acc[r]);
}

constexpr int64_t kFewRows = 8;

void f32_block_few_rows(const uint8_t* packed, const BFloat16* sz, int64_t group, const float* x, int64_t m_len,
                        int64_t k_len, int64_t n0, int64_t n_len, BFloat16* out) {
  switch (m_len) {
    case 1: f32_few_rows<1>(packed, sz, group, x, k_len, n0, n_len, out); break;
    case 2: f32_few_rows<2>(packed, sz, group, x, k_len, n0, n_len, out); break;
    case 3: f32_few_rows<3>(packed, sz, group, x, k_len, n0, n_len, out); break;
    case 4: f32_few_rows<4>(packed, sz, group, x, k_len, n0, n_len, out); break;
    case 5: f32_few_rows<5>(packed, sz, group, x, k_len, n0, n_len, out); break;
    case 6: f32_few_rows<6>(packed, sz, group, x, k_len, n0, n_len, out); break;
    case 7: f32_few_rows<7>(packed, sz, group, x, k_len, n0, n_len, out); break;
    case 8: f32_few_rows<8>(packed, sz, group, x, k_len, n0, n_len, out); break;
    default: TORCH_CHECK(false, "f32_block_few_rows: ", m_len, " rows");
  }
}

at::Tensor int4_linear_f32(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales_zeros,
                           int64_t group, int64_t out_features) {
  check_layout(x, packed, scales_zeros, group, out_features);
  const int64_t k_len = x.size(-1), blocks = packed.size(0), groups = k_len / group;
  // bf16 → float32 is exact: ATen's kernel widens each input the same way.
  const at::Tensor rows = x.reshape({-1, k_len}).to(at::kBFloat16).to(at::kFloat).contiguous();
  const int64_t m_len = rows.size(0);
  at::Tensor out = at::empty({m_len, out_features}, x.options().dtype(at::kBFloat16));
  const float* xp = rows.data_ptr<float>();
  const uint8_t* pp = packed.data_ptr<uint8_t>();
  const BFloat16* szp = scales_zeros.data_ptr<BFloat16>();
  BFloat16* op = out.data_ptr<BFloat16>();
  const int64_t block_bytes = k_len / kStep * 32, pairs = blocks / 2;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out_features;
  const int64_t sz_block = groups * 2 * kLanes;
  if (m_len <= kFewRows) {
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b)
        f32_block_few_rows(pp + b * block_bytes, szp + b * sz_block, group, xp, m_len, k_len, b * kLanes,
                           out_features, op);
    });
    return out.view(shape);
  }
  at::parallel_for(0, pairs + blocks % 2, 1, [&](int64_t begin, int64_t end) {
    std::unique_ptr<float[]> buffer(new float[k_len * 2 * kLanes]);
    float* w = buffer.get();
    for (int64_t p = begin; p < end; ++p) {
      const int64_t b0 = 2 * p, width = p < pairs ? 2 : 1;
      for (int64_t b = b0; b < b0 + width; ++b)
        dequantise_block(pp + b * block_bytes, szp + b * sz_block, group, k_len, w + (b - b0) * kLanes, width * kLanes);
      if (width == 2) f32_rows<2>(xp, w, m_len, k_len, b0 * kLanes, out_features, op);
      else f32_rows<1>(xp, w, m_len, k_len, b0 * kLanes, out_features, op);
    }
  });
  return out.view(shape);
}

bool int4_supported() { return has_avx512_bf16(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(llm_cpu, m) {
  m.def("int4_linear(Tensor x, Tensor packed, Tensor scales_zeros, int group, int out_features) -> Tensor");
  m.def("int4_linear_f32(Tensor x, Tensor packed, Tensor scales_zeros, int group, int out_features) -> Tensor");
  m.def("int4_pack(Tensor q, Tensor scales, Tensor zeros, int group) -> (Tensor, Tensor)", &int4_pack);
  m.def("int4_supported() -> bool", &int4_supported);
}

TORCH_LIBRARY_IMPL(llm_cpu, CPU, m) {
  m.impl("int4_linear", &int4_linear);
  m.impl("int4_linear_f32", &int4_linear_f32);
}
