// int4_awq's weight for a prompt chunk: torch's tiled uint4 layout (torch._convert_weight_to_int4pack_for_cpu)
// turned back into a bf16 Wᵀ [in, out], so that the chunk's rows run one bf16 GEMM (oneDNN: AVX512-BF16 / AMX)
// instead of _weight_int4pack_mm_for_cpu's float32 FMA tiles, which slow down with the rows (30 layers, 256 rows:
// 347 → 131 ms on Zen 4). Each weight is dequantised as ATen's AVX-512 and portable int4 kernels do it,
// fma(q - 8, scale, zero) in float32 (its AVX2 kernel orders the FMAs otherwise: at most float32's last bit apart),
// then rounded to bf16.
//
// The tiled layout, per block of `block_n` output rows (the last block may be shorter) starting at n0, stored at
// n0 * K / 2: for each input k, block_n / 2 bytes. Full blocks of the AVX-512 and AVX2 kernels ("split") hold row
// n0 + j in byte j's low nibble and row n0 + j + block_n / 2 in its high nibble; the other blocks and the
// non-vectorised kernel ("interleaved") hold rows n0 + 2j and n0 + 2j + 1. quant.py picks block_n and the mode from
// torch's CPU capability, and a test checks the result against the int4 kernel's own product with the identity.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include "lanes.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using c10::BFloat16;

using llm_cpu_kernels::has_avx512;
using llm_cpu_kernels::store16;

// One k of a split block, 16 bytes at a time: their low nibbles are rows j..j+15, their high nibbles rows
// half+j..half+j+15 (scale and zero indexed by row within the block).
__attribute__((target("avx512f,avx512bw")))
void unpack_split_avx512(const uint8_t* bytes, const float* scale, const float* zero, int64_t half, BFloat16* row) {
  const __m512i low4 = _mm512_set1_epi32(15);
  const __m512 eight = _mm512_set1_ps(8.f);
  for (int64_t j = 0; j < half; j += 16) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + j)));
    const __m512 lo = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, low4)), eight);
    const __m512 hi = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), eight);
    store16(row + j, _mm512_fmadd_ps(lo, _mm512_loadu_ps(scale + j), _mm512_loadu_ps(zero + j)));
    store16(row + half + j, _mm512_fmadd_ps(hi, _mm512_loadu_ps(scale + half + j), _mm512_loadu_ps(zero + half + j)));
  }
}

template <bool Split>
void unpack_block(const uint8_t* src, const BFloat16* scales_zeros, int64_t n0, int64_t nb, int64_t n_len,
                  int64_t k_len, int64_t group, BFloat16* out) {
  const int64_t half = nb / 2;
  std::vector<float> scale(nb), zero(nb);
  for (int64_t k = 0; k < k_len; ++k) {
    if (k % group == 0) {  // [groups, N, 2]: this group's (scale, zero) of the block's rows
      const BFloat16* sz = scales_zeros + ((k / group) * n_len + n0) * 2;
      for (int64_t r = 0; r < nb; ++r) {
        scale[r] = static_cast<float>(sz[2 * r]);
        zero[r] = static_cast<float>(sz[2 * r + 1]);
      }
    }
    const uint8_t* bytes = src + k * half;
    BFloat16* row = out + k * n_len + n0;
    if (Split && half % 16 == 0 && has_avx512()) {
      unpack_split_avx512(bytes, scale.data(), zero.data(), half, row);
      continue;
    }
    for (int64_t j = 0; j < half; ++j) {
      const int64_t r0 = Split ? j : 2 * j, r1 = Split ? j + half : 2 * j + 1;
      const float lo = static_cast<float>(bytes[j] & 15) - 8.f, hi = static_cast<float>(bytes[j] >> 4) - 8.f;
      row[r0] = static_cast<BFloat16>(std::fma(lo, scale[r0], zero[r0]));
      row[r1] = static_cast<BFloat16>(std::fma(hi, scale[r1], zero[r1]));
    }
  }
}

at::Tensor int4pack_to_bf16(const at::Tensor& packed, const at::Tensor& scales_zeros, int64_t group, int64_t block_n,
                            bool split) {
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.is_contiguous(),
              "int4pack_to_bf16: packed must be torch's contiguous uint8 [out, in / 2] int4 layout");
  const int64_t n_len = packed.size(0), k_len = packed.size(1) * 2;
  TORCH_CHECK(scales_zeros.scalar_type() == at::kBFloat16 && scales_zeros.is_contiguous() &&
              scales_zeros.dim() == 3 && scales_zeros.size(0) * group == k_len && scales_zeros.size(1) == n_len &&
              scales_zeros.size(2) == 2, "int4pack_to_bf16: scales_zeros must be contiguous bf16 [in / group, out, 2]");
  TORCH_CHECK(block_n > 0 && block_n % 2 == 0 && n_len % 2 == 0, "int4pack_to_bf16: even block_n and rows");
  at::Tensor out = at::empty({k_len, n_len}, packed.options().dtype(at::kBFloat16));
  const uint8_t* src = packed.data_ptr<uint8_t>();
  const BFloat16* sz = scales_zeros.data_ptr<BFloat16>();
  BFloat16* dst = out.data_ptr<BFloat16>();
  const int64_t blocks = (n_len + block_n - 1) / block_n;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * block_n, nb = std::min(block_n, n_len - n0);
      const uint8_t* block = src + n0 * k_len / 2;
      if (split && nb == block_n) unpack_block<true>(block, sz, n0, nb, n_len, k_len, group, dst);
      else unpack_block<false>(block, sz, n0, nb, n_len, k_len, group, dst);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llm_cpu, m) {
  m.def("int4pack_to_bf16(Tensor packed, Tensor scales_zeros, int group, int block_n, bool split) -> Tensor");
}

TORCH_LIBRARY_IMPL(llm_cpu, CPU, m) { m.impl("int4pack_to_bf16", &int4pack_to_bf16); }
