// The built-in model's 2x2 max-pool and the ReLU after it, fused, for
// channels-last float32 on AVX-512 CPUs (worker/fused_pool.py builds and
// loads it). aten's max-pool keeps int64 indices and zero-fills the whole
// input gradient before scattering into it; this keeps a one-byte code per
// output and writes the input gradient in one pass. The values and gradients
// are aten's bit for bit: the first maximum in row-major order wins a window
// (a later NaN replaces it, as in aten's loop), and the ReLU's backward
// passes a gradient wherever its output is not <= 0 (NaN included).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
// x: N,C,H,W channels-last float32, C % 16 == 0, H and W even. relu(maxpool2x2(x)) channels-last and a uint8 code
// (N,H2,W2,C): 0-3 = the window's winner (row-major, first max wins), 4 = cut by relu (max <= 0).
std::vector<torch::Tensor> fwd(torch::Tensor x) {
  auto N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  auto H2 = H / 2, W2 = W / 2;
  auto out = torch::empty({N, C, H2, W2}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  auto code = torch::empty({N, H2, W2, C}, x.options().dtype(torch::kUInt8));
  const float* xp = x.data_ptr<float>(); float* op = out.data_ptr<float>(); uint8_t* cp = code.data_ptr<uint8_t>();
  at::parallel_for(0, N * H2, 1, [&](int64_t b, int64_t e) {
    const __m512i one = _mm512_set1_epi32(1), two = _mm512_set1_epi32(2), three = _mm512_set1_epi32(3), four = _mm512_set1_epi32(4), zi = _mm512_setzero_si512();
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t nh = b; nh < e; ++nh) {
      int64_t n = nh / H2, h2 = nh % H2;
      for (int64_t w2 = 0; w2 < W2; ++w2) {
        const float* r0 = xp + ((n * H + 2 * h2) * W + 2 * w2) * C;
        const float* r1 = r0 + W * C;
        float* o = op + ((n * H2 + h2) * W2 + w2) * C;
        uint8_t* k = cp + ((n * H2 + h2) * W2 + w2) * C;
        for (int64_t c = 0; c < C; c += 16) {
          __m512 a = _mm512_loadu_ps(r0 + c), bb = _mm512_loadu_ps(r0 + C + c);
          __m512 d = _mm512_loadu_ps(r1 + c), ee = _mm512_loadu_ps(r1 + C + c);
          // v replaces the maximum so far when v > it or v is NaN.
          __mmask16 mb = _mm512_cmp_ps_mask(bb, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(bb, bb, _CMP_UNORD_Q);
          __m512 m01 = _mm512_mask_blend_ps(mb, a, bb); __m512i i01 = _mm512_mask_blend_epi32(mb, zi, one);
          __mmask16 me = _mm512_cmp_ps_mask(ee, d, _CMP_GT_OQ) | _mm512_cmp_ps_mask(ee, ee, _CMP_UNORD_Q);
          __m512 m23 = _mm512_mask_blend_ps(me, d, ee); __m512i i23 = _mm512_mask_blend_epi32(me, two, three);
          // The second row's winner replaces the first's as it would have in
          // one scan: when greater, or NaN.
          __mmask16 s = _mm512_cmp_ps_mask(m23, m01, _CMP_GT_OQ) | _mm512_cmp_ps_mask(m23, m23, _CMP_UNORD_Q);
          __m512 m = _mm512_mask_blend_ps(s, m01, m23); __m512i idx = _mm512_mask_blend_epi32(s, i01, i23);
          // ReLU keeps what is not <= 0 (NaN stays NaN, and its gradient passes).
          __mmask16 keep = _mm512_cmp_ps_mask(m, zero, _CMP_NLE_UQ);
          _mm512_storeu_ps(o + c, _mm512_maskz_mov_ps(keep, m));
          _mm_storeu_si128((__m128i*)(k + c), _mm512_cvtepi32_epi8(_mm512_mask_blend_epi32(keep, four, idx)));
        }
      }
    }
  });
  return {out, code};
}
torch::Tensor bwd(torch::Tensor g, torch::Tensor code, int64_t H, int64_t W) {
  g = g.contiguous(at::MemoryFormat::ChannelsLast);
  auto N = g.size(0), C = g.size(1), H2 = g.size(2), W2 = g.size(3);
  auto gx = torch::empty({N, C, H, W}, g.options().memory_format(at::MemoryFormat::ChannelsLast));
  const float* gp = g.data_ptr<float>(); const uint8_t* cp = code.data_ptr<uint8_t>(); float* xp = gx.data_ptr<float>();
  at::parallel_for(0, N * H2, 1, [&](int64_t b, int64_t e) {
    const __m512i q1 = _mm512_set1_epi32(1), q2 = _mm512_set1_epi32(2), q3 = _mm512_set1_epi32(3), q0 = _mm512_setzero_si512();
    for (int64_t nh = b; nh < e; ++nh) {
      int64_t n = nh / H2, h2 = nh % H2;
      for (int64_t w2 = 0; w2 < W2; ++w2) {
        float* r0 = xp + ((n * H + 2 * h2) * W + 2 * w2) * C;
        float* r1 = r0 + W * C;
        const float* gg = gp + ((n * H2 + h2) * W2 + w2) * C;
        const uint8_t* k = cp + ((n * H2 + h2) * W2 + w2) * C;
        for (int64_t c = 0; c < C; c += 16) {
          __m512 v = _mm512_loadu_ps(gg + c);
          __m512i i = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(k + c)));
          _mm512_storeu_ps(r0 + c, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, q0), v));
          _mm512_storeu_ps(r0 + C + c, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, q1), v));
          _mm512_storeu_ps(r1 + c, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, q2), v));
          _mm512_storeu_ps(r1 + C + c, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, q3), v));
        }
      }
    }
  });
  return gx;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd", &fwd);
  m.def("bwd", &bwd);
}
