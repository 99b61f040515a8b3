// Weight-only int8 projection (int8_wo's projections, and the vocabulary head of int8_wo and int4_awq): ATen's
// _weight_int8pack_mm numbers bit for bit, from a layout that streams.
//
// ATen's AVX-512 kernel (aten/src/ATen/native/cpu/int8mm_kernel.cpp) gives every output n one 16-lane float32
// accumulator: for k = 0, 16, 32, ... acc = fma(float(x[k..k+15]), float(w[n, k..k+15]) * scale[n], acc), then
// _mm512_reduce_add_ps, rounded to bf16. Its tiles read 4 weight rows at once, 16 bytes of each per step: four
// interleaved 576-byte streams that the hardware prefetcher follows badly (one 49,152 x 576 head, 1 row, 2 threads
// on Zen 4: 2.0-3.2 ms, 9-14 GB/s, where a sequential read runs at ~26 GB/s). Here the weights are laid out per
// tile of 8 outputs and step of 16 inputs (quant.WeightOnlyInt8Linear.tile: [ceil(N / 8), K / 16, 8, 16]), so a
// tile is one sequential read, and each output goes through the same operations in the same order: the same bits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include "lanes.h"

#include <cstdint>
#include <vector>

namespace {

using c10::BFloat16;

constexpr int64_t kCols = 8;   // outputs of a tile
constexpr int64_t kStep = 16;  // inputs of a step: one float32 lane each
constexpr int kRowTile = 4;    // input rows that share a tile's weights while they are in registers

// Input rows m0.. by the tile of outputs n0..n0+7 (those < n_len are stored).
template <int Rows>
__attribute__((target("avx512f,avx512bw")))
void tile(const BFloat16* x, const int8_t* tile_weights, const BFloat16* scales, int64_t k_len, int64_t n_len,
          int64_t m0, int64_t n0, BFloat16* out) {
  __m512 scale[kCols], acc[Rows][kCols];
  for (int64_t c = 0; c < kCols; ++c)
    scale[c] = _mm512_set1_ps(n0 + c < n_len ? static_cast<float>(scales[n0 + c]) : 0.f);  // zero rows pad the last
  for (int r = 0; r < Rows; ++r)
    for (int64_t c = 0; c < kCols; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < k_len; k += kStep) {
    const int8_t* step = tile_weights + k * kCols;
    __m512 w[kCols];
    for (int64_t c = 0; c < kCols; ++c) {
      const __m512i wide = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(step + c * kStep)));
      w[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(wide), scale[c]);
    }
    for (int r = 0; r < Rows; ++r) {
      const __m512 a = llm_cpu_kernels::load16(x + (m0 + r) * k_len + k);
      for (int64_t c = 0; c < kCols; ++c) acc[r][c] = _mm512_fmadd_ps(a, w[c], acc[r][c]);
    }
  }
  for (int r = 0; r < Rows; ++r)
    for (int64_t c = 0; c < kCols && n0 + c < n_len; ++c)
      out[(m0 + r) * n_len + n0 + c] = static_cast<BFloat16>(_mm512_reduce_add_ps(acc[r][c]));
}

bool supported() { return llm_cpu_kernels::has_avx512(); }

at::Tensor int8_wo_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales) {
  TORCH_CHECK(supported(), "int8_wo_linear needs AVX-512 (int8_wo_supported() says where it runs)");
  const int64_t k_len = x.size(-1), n_len = scales.numel(), tiles = (n_len + kCols - 1) / kCols;
  TORCH_CHECK(x.scalar_type() == at::kBFloat16, "int8_wo_linear: x must be bfloat16");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.is_contiguous() && packed.dim() == 4 &&
                  packed.size(0) == tiles && packed.size(1) * kStep == k_len && packed.size(2) == kCols &&
                  packed.size(3) == kStep,
              "int8_wo_linear: packed must be WeightOnlyInt8Linear.tile()'s int8 [", tiles, ", ", k_len / kStep,
              ", 8, 16]");
  TORCH_CHECK(scales.scalar_type() == at::kBFloat16 && scales.is_contiguous(),
              "int8_wo_linear: scales must be contiguous bfloat16 [out]");
  const at::Tensor rows = x.reshape({-1, k_len}).contiguous();
  const int64_t m_len = rows.size(0);
  at::Tensor out = at::empty({m_len, n_len}, rows.options());
  const BFloat16* xp = rows.data_ptr<BFloat16>();
  const int8_t* wp = packed.data_ptr<int8_t>();
  const BFloat16* sp = scales.data_ptr<BFloat16>();
  BFloat16* op = out.data_ptr<BFloat16>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int8_t* weights = wp + t * k_len * kCols;
      int64_t m0 = 0;
      for (; m0 + kRowTile <= m_len; m0 += kRowTile)
        tile<kRowTile>(xp, weights, sp, k_len, n_len, m0, t * kCols, op);
      for (; m0 < m_len; ++m0) tile<1>(xp, weights, sp, k_len, n_len, m0, t * kCols, op);
    }
  });
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n_len;
  return out.view(shape);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llm_cpu, m) {
  m.def("int8_wo_linear(Tensor x, Tensor packed, Tensor scales) -> Tensor");
  m.def("int8_wo_supported() -> bool", &supported);
}

TORCH_LIBRARY_IMPL(llm_cpu, CPU, m) { m.impl("int8_wo_linear", &int8_wo_linear); }
