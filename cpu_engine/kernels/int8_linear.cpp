// W8A8 projection with the activation quantisation fused: one call does what SmoothQuantLinear's eager path does
// in ~12 ATen calls (cpu_engine/quant.py), bit for bit:
//   v = float(x) * inv_smooth;  a = max(max|v|, 1e-8) / 127 per row;  q = round_half_even(v * (1 / a)) in [-127, 127]
//   out = (float(q @ Wᵀ) * a) * scale, rounded to x's dtype   (Wᵀ: int8 [in, out] view of the [out, in] weight)
// The int8 GEMM is torch._int_mm (oneDNN's s8s8s32 GEMM, VNNI where the CPU has it). The quantisation and the
// epilogue read and write float32 or bfloat16 in place (no conversion copies: 2 of them per projection cost a
// 16-row decode step ~1.5 ms) with AVX-512 where the CPU has it, scalar loops of the same arithmetic elsewhere.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include "lanes.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace {

using c10::BFloat16;

using llm_cpu_kernels::has_avx512;
using llm_cpu_kernels::load16;
using llm_cpu_kernels::store16;

template <typename T>
void quantise_row_scalar(const T* row, const float* inv_smooth, int64_t k_len, int8_t* out, float* scale) {
  float amax = 0.f;
  for (int64_t k = 0; k < k_len; ++k) amax = std::max(amax, std::fabs(static_cast<float>(row[k]) * inv_smooth[k]));
  const float a = std::max(amax, 1e-8f) / 127.0f;
  const float inv = 1.0f / a;
  for (int64_t k = 0; k < k_len; ++k) {
    const float v = std::nearbyint((static_cast<float>(row[k]) * inv_smooth[k]) * inv);  // half to even
    out[k] = static_cast<int8_t>(std::min(std::max(v, -127.f), 127.f));
  }
  *scale = a;
}

template <typename T>
__attribute__((target("avx512f,avx512bw")))
void quantise_row_avx512(const T* row, const float* inv_smooth, int64_t k_len, int8_t* out, float* scale) {
  __m512 vmax = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= k_len; k += 16) {
    vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_mul_ps(load16(row + k), _mm512_loadu_ps(inv_smooth + k))));
  }
  float amax = _mm512_reduce_max_ps(vmax);
  for (int64_t t = k; t < k_len; ++t) amax = std::max(amax, std::fabs(static_cast<float>(row[t]) * inv_smooth[t]));
  const float a = std::max(amax, 1e-8f) / 127.0f;
  const float inv = 1.0f / a;
  const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  for (k = 0; k + 16 <= k_len; k += 16) {
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(load16(row + k), _mm512_loadu_ps(inv_smooth + k)), vinv);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    // cvtps rounds with MXCSR's mode, round-half-to-even by default (torch.round's rule).
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + k), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
  }
  for (; k < k_len; ++k) {
    const float v = std::nearbyint((static_cast<float>(row[k]) * inv_smooth[k]) * inv);
    out[k] = static_cast<int8_t>(std::min(std::max(v, -127.f), 127.f));
  }
  *scale = a;
}

template <typename T>
void dequantise_row_scalar(const int32_t* acc, float a, const float* scales, int64_t n_len, T* out) {
  for (int64_t n = 0; n < n_len; ++n) out[n] = static_cast<T>((static_cast<float>(acc[n]) * a) * scales[n]);
}

template <typename T>
__attribute__((target("avx512f,avx512bw")))
void dequantise_row_avx512(const int32_t* acc, float a, const float* scales, int64_t n_len, T* out) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t n = 0;
  for (; n + 16 <= n_len; n += 16) {
    const __m512 v = _mm512_cvtepi32_ps(_mm512_loadu_si512(acc + n));
    store16(out + n, _mm512_mul_ps(_mm512_mul_ps(v, va), _mm512_loadu_ps(scales + n)));
  }
  for (; n < n_len; ++n) out[n] = static_cast<T>((static_cast<float>(acc[n]) * a) * scales[n]);
}

// Waking the OpenMP pool costs more than a decode step's few rows take on one core: split from ~32k elements.
int64_t rows_per_task(int64_t width) { return std::max<int64_t>(1, (int64_t{1} << 15) / width); }

template <typename T>
at::Tensor int8_linear_impl(const at::Tensor& rows, const at::Tensor& inv_smooth, const at::Tensor& weight,
                            const at::Tensor& scales) {
  const int64_t m_len = rows.size(0), k_len = rows.size(1), n_len = weight.size(0);
  at::Tensor q = at::empty({m_len, k_len}, rows.options().dtype(at::kChar));
  at::Tensor act = at::empty({m_len}, rows.options().dtype(at::kFloat));
  const T* r = rows.data_ptr<T>();
  const float* s = inv_smooth.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* ap = act.data_ptr<float>();
  const bool avx512 = has_avx512();
  at::parallel_for(0, m_len, rows_per_task(k_len), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      if (avx512) quantise_row_avx512(r + m * k_len, s, k_len, qp + m * k_len, ap + m);
      else quantise_row_scalar(r + m * k_len, s, k_len, qp + m * k_len, ap + m);
    }
  });
  const at::Tensor acc = at::_int_mm(q, weight.t());
  at::Tensor out = at::empty({m_len, n_len}, rows.options());
  const int32_t* cp = acc.data_ptr<int32_t>();
  const float* sc = scales.data_ptr<float>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, m_len, rows_per_task(n_len), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      if (avx512) dequantise_row_avx512(cp + m * n_len, ap[m], sc, n_len, op + m * n_len);
      else dequantise_row_scalar(cp + m * n_len, ap[m], sc, n_len, op + m * n_len);
    }
  });
  return out;
}

at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& inv_smooth, const at::Tensor& weight,
                       const at::Tensor& scales) {
  const int64_t k_len = x.size(-1), n_len = weight.size(0);
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.dim() == 2 && weight.size(1) == k_len &&
              weight.is_contiguous(), "int8_linear: weight must be a contiguous int8 [out, in] tensor with in = ", k_len);
  TORCH_CHECK(inv_smooth.scalar_type() == at::kFloat && inv_smooth.numel() == k_len && inv_smooth.is_contiguous() &&
              scales.scalar_type() == at::kFloat && scales.numel() == n_len && scales.is_contiguous(),
              "int8_linear: inv_smooth [in] and scales [out] must be contiguous float32");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor rows = x.reshape({-1, k_len}).to(bf16 ? at::kBFloat16 : at::kFloat).contiguous();
  at::Tensor out = bf16 ? int8_linear_impl<BFloat16>(rows, inv_smooth, weight, scales)
                        : int8_linear_impl<float>(rows, inv_smooth, weight, scales);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n_len;
  return out.view(shape).to(x.scalar_type());
}

std::string int8_linear_isa() { return has_avx512() ? "avx512" : "scalar"; }

}  // namespace

TORCH_LIBRARY(llm_cpu, m) {
  m.def("int8_linear(Tensor x, Tensor inv_smooth, Tensor weight, Tensor scales) -> Tensor");
  m.def("int8_linear_isa() -> str", &int8_linear_isa);
}

TORCH_LIBRARY_IMPL(llm_cpu, CPU, m) { m.impl("int8_linear", &int8_linear); }
