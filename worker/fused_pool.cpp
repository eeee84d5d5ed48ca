// The built-in model's 2x2 max-pool and the ReLU after it, fused, for
// channels-last float32 or bfloat16 on AVX-512 CPUs (worker/fused_pool.py
// builds and loads it). aten's max-pool keeps int64 indices and zero-fills
// the whole input gradient before scattering into it; this keeps a one-byte
// code per output and writes the input gradient in one pass. The values and
// gradients are aten's bit for bit: the first maximum in row-major order wins
// a window (a later NaN replaces it, as in aten's loop), and the ReLU's
// backward passes a gradient wherever its output is not <= 0 (NaN included).
// bfloat16 values are compared as the float32 they widen to, exactly, and
// every value written is one read (or zero), so nothing is rounded.
//
// fwd_nchw/bwd_nchw go on to the model's next steps in the same pass: the
// output laid out NCHW (fc1's flatten order) and, given a dropout mask
// (bool, NCHW), (y * keep) * scale, the two products the model's own ops
// make, in their order and rounding; the backward takes the NCHW gradient
// and applies (g * scale) * keep before the max-pool's. That saves the two
// layout copies and the four multiplications on the whole tensor around
// them (about a tenth of a float32 step here).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load16(const at::BFloat16* p) {
  __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

inline void store16(at::BFloat16* p, __m512 v) {
  // v is a widened bfloat16 (or zero): its top half is the value.
  __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(v), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bits));
}

// float32 to bfloat16, to nearest with ties to even as c10::BFloat16 rounds
// (NaN stays NaN), returned widened: what bfloat16 ops compute in float32
// and store.
inline __m512 round_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc00000));
  return _mm512_castsi512_ps(r);
}

// v * s as a T op computes it: in float32, stored as T.
inline __m512 times(__m512 v, __m512 s, float*) { return _mm512_mul_ps(v, s); }
inline __m512 times(__m512 v, __m512 s, at::BFloat16*) { return round_bf16(_mm512_mul_ps(v, s)); }

// 16 mask bytes, one per channel c..c+15 of an NCHW mask (channel stride
// `stride`), as 1.0 or 0.0.
inline __m512 mask16(const bool* k, int64_t stride) {
  alignas(16) uint8_t bytes[16];
  for (int j = 0; j < 16; ++j) bytes[j] = k[j * stride] ? 1 : 0;
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes))));
}

// v replaces the maximum so far when v > it, or v is NaN.
inline __mmask16 replaces(__m512 v, __m512 so_far) {
  return _mm512_cmp_ps_mask(v, so_far, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
}

// Sixteen channels' 2x2 windows (rows r0 and r1, C apart along a row):
// relu(max), and a code each, 0-3 the winner in row-major order, 4 where
// the ReLU cut it.
struct Pooled {
  __m512 value;
  __m128i code;
};

template <typename T>
inline Pooled pool16(const T* r0, const T* r1, int64_t C) {
  const __m512 a = load16(r0), b = load16(r0 + C);
  const __m512 d = load16(r1), e = load16(r1 + C);
  const __mmask16 b_wins = replaces(b, a);
  const __m512 top = _mm512_mask_blend_ps(b_wins, a, b);
  const __m512i top_at = _mm512_mask_blend_epi32(b_wins, _mm512_setzero_si512(), _mm512_set1_epi32(1));
  const __mmask16 e_wins = replaces(e, d);
  const __m512 bottom = _mm512_mask_blend_ps(e_wins, d, e);
  const __m512i bottom_at = _mm512_mask_blend_epi32(e_wins, _mm512_set1_epi32(2), _mm512_set1_epi32(3));
  // The second row's winner replaces the first's as it would have in one
  // scan of the window.
  const __mmask16 second = replaces(bottom, top);
  const __m512 m = _mm512_mask_blend_ps(second, top, bottom);
  const __m512i at = _mm512_mask_blend_epi32(second, top_at, bottom_at);
  // ReLU keeps what is not <= 0 (NaN stays NaN; its gradient passes).
  const __mmask16 keep = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_NLE_UQ);
  return {_mm512_maskz_mov_ps(keep, m),
          _mm512_cvtepi32_epi8(_mm512_mask_blend_epi32(keep, _mm512_set1_epi32(4), at))};
}

// Sixteen channels' gradients v to their windows' winners (by code), zero
// to the rest, after + 0: aten adds each gradient into a zero-filled
// tensor, so a -0 (one that dropout zeroed) arrives as +0.
template <typename T>
inline void unpool16(T* r0, T* r1, int64_t C, const uint8_t* code, __m512 v) {
  v = _mm512_add_ps(v, _mm512_setzero_ps());
  const __m512i i = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(code)));
  store16(r0, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, _mm512_setzero_si512()), v));
  store16(r0 + C, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, _mm512_set1_epi32(1)), v));
  store16(r1, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, _mm512_set1_epi32(2)), v));
  store16(r1 + C, _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(i, _mm512_set1_epi32(3)), v));
}

// x: N,C,H,W channels-last, C % 16 == 0, H and W even. Returns
// relu(max_pool2d(x, 2)) channels-last, and a code (N,H2,W2,C): pool16's.
template <typename T>
std::vector<torch::Tensor> forward(const torch::Tensor& x) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t H2 = H / 2, W2 = W / 2;
  auto out = torch::empty({N, C, H2, W2}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  auto code = torch::empty({N, H2, W2, C}, x.options().dtype(torch::kUInt8));
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  uint8_t* cp = code.data_ptr<uint8_t>();
  at::parallel_for(0, N * H2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t n = nh / H2, h2 = nh % H2;
      for (int64_t w2 = 0; w2 < W2; ++w2) {
        const T* r0 = xp + ((n * H + 2 * h2) * W + 2 * w2) * C;
        T* o = op + ((n * H2 + h2) * W2 + w2) * C;
        uint8_t* k = cp + ((n * H2 + h2) * W2 + w2) * C;
        for (int64_t c = 0; c < C; c += 16) {
          const Pooled pooled = pool16(r0 + c, r0 + W * C + c, C);
          store16(o + c, pooled.value);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(k + c), pooled.code);
        }
      }
    }
  });
  return {out, code};
}

// The input gradient, channels-last (N,C,H,W): each window's winner gets the
// output's gradient, the rest (and cut windows) zero; written once. A -0
// gradient is written +0, as aten's sum into zeros makes it.
template <typename T>
torch::Tensor backward(torch::Tensor g, const torch::Tensor& code, int64_t H, int64_t W) {
  g = g.contiguous(at::MemoryFormat::ChannelsLast);
  const int64_t N = g.size(0), C = g.size(1), H2 = g.size(2), W2 = g.size(3);
  auto gx = torch::empty({N, C, H, W}, g.options().memory_format(at::MemoryFormat::ChannelsLast));
  const T* gp = g.data_ptr<T>();
  const uint8_t* cp = code.data_ptr<uint8_t>();
  T* xp = gx.data_ptr<T>();
  at::parallel_for(0, N * H2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t n = nh / H2, h2 = nh % H2;
      for (int64_t w2 = 0; w2 < W2; ++w2) {
        T* r0 = xp + ((n * H + 2 * h2) * W + 2 * w2) * C;
        const T* gg = gp + ((n * H2 + h2) * W2 + w2) * C;
        const uint8_t* k = cp + ((n * H2 + h2) * W2 + w2) * C;
        for (int64_t c = 0; c < C; c += 16) {
          unpool16(r0 + c, r0 + W * C + c, C, k + c, load16(gg + c));
        }
      }
    }
  });
  return gx;
}

// As forward, the output NCHW and, with a mask, (y * keep) * scale.
template <typename T>
std::vector<torch::Tensor> forward_nchw(
    const torch::Tensor& x, const c10::optional<torch::Tensor>& keep, double scale) {
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t H2 = H / 2, W2 = W / 2, HW2 = H2 * W2;
  auto out = torch::empty({N, C, H2, W2}, x.options());
  auto code = torch::empty({N, H2, W2, C}, x.options().dtype(torch::kUInt8));
  const T* xp = x.data_ptr<T>();
  T* op = out.data_ptr<T>();
  uint8_t* cp = code.data_ptr<uint8_t>();
  const bool* kp = keep ? keep->data_ptr<bool>() : nullptr;
  const float s = static_cast<float>(scale);  // a Python float scales a float32 op as float32
  at::parallel_for(0, N * H2, 1, [&](int64_t begin, int64_t end) {
    const __m512 sv = _mm512_set1_ps(s);
    alignas(64) T staged[16];
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t n = nh / H2, h2 = nh % H2;
      for (int64_t w2 = 0; w2 < W2; ++w2) {
        const T* r0 = xp + ((n * H + 2 * h2) * W + 2 * w2) * C;
        uint8_t* k = cp + ((n * H2 + h2) * W2 + w2) * C;
        for (int64_t c = 0; c < C; c += 16) {
          const Pooled pooled = pool16(r0 + c, r0 + W * C + c, C);
          __m512 y = pooled.value;
          const int64_t first = (n * C + c) * HW2 + h2 * W2 + w2;  // channel c's output
          if (kp != nullptr) {
            // y * keep is exact (y or a zero of y's sign); then the scale, rounded as T.
            y = times(_mm512_mul_ps(y, mask16(kp + first, HW2)), sv, staged);
          }
          store16(staged, y);
          for (int j = 0; j < 16; ++j) op[first + j * HW2] = staged[j];
          _mm_storeu_si128(reinterpret_cast<__m128i*>(k + c), pooled.code);
        }
      }
    }
  });
  return {out, code};
}

// As backward, from an NCHW gradient and, with a mask, (g * scale) * keep.
template <typename T>
torch::Tensor backward_nchw(
    torch::Tensor g, const torch::Tensor& code, const c10::optional<torch::Tensor>& keep,
    double scale, int64_t H, int64_t W) {
  g = g.contiguous();
  const int64_t N = g.size(0), C = g.size(1), H2 = g.size(2), W2 = g.size(3), HW2 = H2 * W2;
  auto gx = torch::empty({N, C, H, W}, g.options().memory_format(at::MemoryFormat::ChannelsLast));
  const T* gp = g.data_ptr<T>();
  const uint8_t* cp = code.data_ptr<uint8_t>();
  const bool* kp = keep ? keep->data_ptr<bool>() : nullptr;
  const float s = static_cast<float>(scale);
  T* xp = gx.data_ptr<T>();
  at::parallel_for(0, N * H2, 1, [&](int64_t begin, int64_t end) {
    const __m512 sv = _mm512_set1_ps(s);
    alignas(64) T staged[16];
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t n = nh / H2, h2 = nh % H2;
      for (int64_t w2 = 0; w2 < W2; ++w2) {
        T* r0 = xp + ((n * H + 2 * h2) * W + 2 * w2) * C;
        const uint8_t* k = cp + ((n * H2 + h2) * W2 + w2) * C;
        for (int64_t c = 0; c < C; c += 16) {
          const int64_t first = (n * C + c) * HW2 + h2 * W2 + w2;
          for (int j = 0; j < 16; ++j) staged[j] = gp[first + j * HW2];
          __m512 v = load16(staged);
          if (kp != nullptr) v = _mm512_mul_ps(times(v, sv, staged), mask16(kp + first, HW2));
          unpool16(r0 + c, r0 + W * C + c, C, k + c, v);
        }
      }
    }
  });
  return gx;
}

}  // namespace

std::vector<torch::Tensor> fwd(torch::Tensor x) {
  if (x.scalar_type() == at::kBFloat16) return forward<at::BFloat16>(x);
  return forward<float>(x);
}

torch::Tensor bwd(torch::Tensor g, torch::Tensor code, int64_t H, int64_t W) {
  if (g.scalar_type() == at::kBFloat16) return backward<at::BFloat16>(g, code, H, W);
  return backward<float>(g, code, H, W);
}

std::vector<torch::Tensor> fwd_nchw(torch::Tensor x, c10::optional<torch::Tensor> keep, double scale) {
  if (x.scalar_type() == at::kBFloat16) return forward_nchw<at::BFloat16>(x, keep, scale);
  return forward_nchw<float>(x, keep, scale);
}

torch::Tensor bwd_nchw(
    torch::Tensor g, torch::Tensor code, c10::optional<torch::Tensor> keep, double scale,
    int64_t H, int64_t W) {
  if (g.scalar_type() == at::kBFloat16) return backward_nchw<at::BFloat16>(g, code, keep, scale, H, W);
  return backward_nchw<float>(g, code, keep, scale, H, W);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("fwd", &fwd);
  m.def("bwd", &bwd);
  m.def("fwd_nchw", &fwd_nchw);
  m.def("bwd_nchw", &bwd_nchw);
}
