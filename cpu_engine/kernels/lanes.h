// What the engine's kernels share: whether to take their AVX-512 paths, and 16 float32 lanes in and out of float32
// or bfloat16 memory (bf16 widening is exact; narrowing rounds to nearest even, as c10::BFloat16 does).
#pragma once

#include <c10/util/BFloat16.h>

#include <immintrin.h>

#include <cstdlib>
#include <cstring>

namespace llm_cpu_kernels {

// LLM_CPU_KERNELS_ISA=scalar takes the portable loops on an AVX-512 CPU too (tests check both paths).
inline bool has_avx512() {
  static const bool yes = [] {
    const char* isa = std::getenv("LLM_CPU_KERNELS_ISA");
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           !(isa != nullptr && std::strcmp(isa, "scalar") == 0);
  }();
  return yes;
}

__attribute__((target("avx512f,avx512bw"))) inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

__attribute__((target("avx512f,avx512bw"))) inline __m512 load16(const c10::BFloat16* p) {
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

__attribute__((target("avx512f,avx512bw"))) inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

__attribute__((target("avx512f,avx512bw"))) inline void store16(c10::BFloat16* p, __m512 v) {
  // c10::BFloat16's rounding for finite values: add 0x7fff plus the kept part's lowest bit, keep the high half.
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
}

}  // namespace llm_cpu_kernels
