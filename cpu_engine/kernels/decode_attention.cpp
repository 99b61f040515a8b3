// Attention of a decode step (one query a row) straight from the paged KV cache, for the compiled decode step
// (cpu_engine/compiled_step.py): per (row, KV head) the row's keys are read where the cache holds them, scored
// against that head's query heads, and their values summed by the softmax weights, all in float32.
//
// Written as ATen ops the same step gathers every row's keys and values into new tensors and runs two small
// batched matmuls a layer; compiled, 16 rows x 200 keys, that was ~300 µs a layer and 1 row ~80 µs, most of it
// the gather and the matmul's fixed cost. Row b attends to positions 0..positions[b] (its own history), whose
// cache rows are reads[b, 0..positions[b]].
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include "lanes.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

using c10::BFloat16;

constexpr int LANES = 16;  // float32 lanes of an AVX-512 register; the scalar path keeps as many partial sums
constexpr int MAX_GROUPS = 8;  // query heads per KV head the AVX-512 path holds in registers

using llm_cpu_kernels::has_avx512;
using llm_cpu_kernels::load16;

inline float to_float(float v) { return v; }
inline float to_float(BFloat16 v) { return static_cast<float>(v); }

// One (row, KV head): its G query heads q [G][D] (float32, already scaled by 1/sqrt(D)) over n keys, into out.
// The portable path, for CPUs without AVX-512: LANES partial sums a dot product, which compilers vectorise.
template <typename T>
inline void attend_one(const float* q, int64_t groups, int64_t dim, const T* k_cache, const T* v_cache,
                       const int64_t* rows, int64_t n, int64_t row_stride, float* scores, float* acc) {
  for (int64_t g = 0; g < groups; ++g) {
    const float* qg = q + g * dim;
    float* s = scores + g * n;
    for (int64_t l = 0; l < n; ++l) {
      const T* k = k_cache + rows[l] * row_stride;
      float part[LANES] = {};
      for (int64_t d = 0; d < dim; d += LANES)
        for (int t = 0; t < LANES; ++t) part[t] += qg[d + t] * to_float(k[d + t]);
      float sum = 0.f;
      for (int t = 0; t < LANES; ++t) sum += part[t];
      s[l] = sum;
    }
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t l = 0; l < n; ++l) top = std::max(top, s[l]);
    float total = 0.f;
    for (int64_t l = 0; l < n; ++l) {
      s[l] = std::exp(s[l] - top);
      total += s[l];
    }
    float* a = acc + g * dim;
    std::fill(a, a + dim, 0.f);
    for (int64_t l = 0; l < n; ++l) {
      const T* v = v_cache + rows[l] * row_stride;
      const float p = s[l] / total;
      for (int64_t d = 0; d < dim; ++d) a[d] += p * to_float(v[d]);
    }
  }
}

#define AVX512 __attribute__((target("avx512f,avx512bw,fma")))

// e^x for x <= 0 (scores minus their maximum): 2^(x log2 e) = 2^n · 2^f, n = round(x log2 e), |f| <= 1/2, 2^f by
// its degree-6 Taylor polynomial (relative error < 2e-7 there), 2^n applied by vscalefps (e^-inf → 0).
AVX512 inline __m512 exp16(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.693147180559945309f));  // 2^(t-n) = e^f
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// The same computation with each key and value read and widened once for all G query heads, G a template
// argument so that the G accumulators live in registers (a runtime-sized array of them stayed on the stack).
template <int G, typename T>
AVX512 void attend_one_avx512(const float* q, int64_t dim, const T* k_cache, const T* v_cache, const int64_t* rows,
                              int64_t n, int64_t row_stride, float* scores, float* acc) {
  const int64_t chunks = dim / LANES;
  for (int64_t l = 0; l < n; ++l) {
    const T* k = k_cache + rows[l] * row_stride;
    __m512 dot[G];
    for (int g = 0; g < G; ++g) dot[g] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512 kv = load16(k + c * LANES);
      for (int g = 0; g < G; ++g) dot[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * dim + c * LANES), kv, dot[g]);
    }
    for (int g = 0; g < G; ++g) scores[g * n + l] = _mm512_reduce_add_ps(dot[g]);
  }
  const int64_t whole = n - n % LANES;
  for (int g = 0; g < G; ++g) {
    float* s = scores + g * n;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t l = 0; l < n; ++l) top = std::max(top, s[l]);
    const __m512 top16 = _mm512_set1_ps(top);
    __m512 total16 = _mm512_setzero_ps();
    for (int64_t l = 0; l < whole; l += LANES) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + l), top16));
      _mm512_storeu_ps(s + l, e);
      total16 = _mm512_add_ps(total16, e);
    }
    float total = _mm512_reduce_add_ps(total16);
    for (int64_t l = whole; l < n; ++l) {
      s[l] = std::exp(s[l] - top);
      total += s[l];
    }
    const float inv = 1.f / total;
    for (int64_t l = 0; l < n; ++l) s[l] *= inv;
  }
  for (int64_t c = 0; c < chunks; ++c) {  // a chunk of every value row at a time: G accumulators in registers
    __m512 out[G];
    for (int g = 0; g < G; ++g) out[g] = _mm512_setzero_ps();
    for (int64_t l = 0; l < n; ++l) {
      const __m512 vv = load16(v_cache + rows[l] * row_stride + c * LANES);
      for (int g = 0; g < G; ++g) out[g] = _mm512_fmadd_ps(_mm512_set1_ps(scores[g * n + l]), vv, out[g]);
    }
    for (int g = 0; g < G; ++g) _mm512_storeu_ps(acc + g * dim + c * LANES, out[g]);
  }
}

// attend_one_avx512 for this many query heads per KV head (1 to MAX_GROUPS), or false.
template <typename T, int G = 1>
bool attend_avx512(int64_t groups, const float* q, int64_t dim, const T* k_cache, const T* v_cache,
                   const int64_t* rows, int64_t n, int64_t row_stride, float* scores, float* acc) {
  if constexpr (G > MAX_GROUPS) {
    return false;
  } else {
    if (groups != G)
      return attend_avx512<T, G + 1>(groups, q, dim, k_cache, v_cache, rows, n, row_stride, scores, acc);
    attend_one_avx512<G>(q, dim, k_cache, v_cache, rows, n, row_stride, scores, acc);
    return true;
  }
}

template <typename T>
at::Tensor decode_attention_impl(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                 const at::Tensor& reads, const at::Tensor& positions) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), keys = reads.size(1), groups = heads / kv_heads;
  at::Tensor out = at::empty_like(q);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* rp = reads.data_ptr<int64_t>();
  const int64_t* pp = positions.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const bool avx512 = has_avx512();
  const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qs(groups * dim), acc(groups * dim), scores(groups * keys);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / kv_heads, h = task % kv_heads;
      const int64_t n = std::min(pp[b] + 1, keys);
      const T* qrow = qp + (b * heads + h * groups) * dim;
      for (int64_t i = 0; i < groups * dim; ++i) qs[i] = to_float(qrow[i]) * scale;
      const T* k0 = kp + h * dim;  // this head's slice of cache row 0; a cache row holds kv_heads x dim
      const T* v0 = vp + h * dim;
      if (!(avx512 && attend_avx512<T>(groups, qs.data(), dim, k0, v0, rp + b * keys, n, kv_heads * dim,
                                        scores.data(), acc.data())))
        attend_one(qs.data(), groups, dim, k0, v0, rp + b * keys, n, kv_heads * dim, scores.data(), acc.data());
      T* orow = op + (b * heads + h * groups) * dim;
      for (int64_t i = 0; i < groups * dim; ++i) orow[i] = static_cast<T>(acc[i]);
    }
  });
  return out;
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& reads, const at::Tensor& positions) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes() &&
                  q.size(2) == k_cache.size(2) && q.size(2) % LANES == 0 && q.size(1) % k_cache.size(1) == 0,
              "decode_attention: q [B, H, D] and caches [rows, KVH, D] with H a multiple of KVH and D of ", LANES);
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type() &&
                  (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16),
              "decode_attention: q and the caches must be all float32 or all bfloat16");
  TORCH_CHECK(reads.scalar_type() == at::kLong && reads.dim() == 2 && reads.size(0) == q.size(0) &&
                  positions.scalar_type() == at::kLong && positions.numel() == q.size(0),
              "decode_attention: reads [B, L] and positions [B] must be int64");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "decode_attention: the caches must be contiguous");
  const at::Tensor qc = q.contiguous(), rc = reads.contiguous(), pc = positions.contiguous();
  return q.scalar_type() == at::kBFloat16 ? decode_attention_impl<BFloat16>(qc, k_cache, v_cache, rc, pc)
                                          : decode_attention_impl<float>(qc, k_cache, v_cache, rc, pc);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llm_cpu, m) {
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor reads, Tensor positions) -> Tensor");
}

TORCH_LIBRARY_IMPL(llm_cpu, CPU, m) { m.impl("decode_attention", &decode_attention); }
