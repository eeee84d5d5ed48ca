// The built-in model's 2x2 max-pool and the ReLU after it, fused, for
// channels-last float32 or bfloat16 on AVX-512 or AVX2 CPUs
// (worker/fused_pool.py builds and loads it, compiled for one of the two:
// -mavx512f/bw/vl gives the 16-lane build, -mavx2 the 8-lane one). aten's
// max-pool keeps int64 indices and zero-fills
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

// The lanes: L channels at a time, F their float32 values, I an int32 each,
// M a choice per lane (a mask register on AVX-512, all-ones lanes on AVX2).
// Everything below the lanes is written once, in these terms.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
constexpr int L = 16;
using F = __m512;
using I = __m512i;
using M = __mmask16;

inline F zero() { return _mm512_setzero_ps(); }
inline F splat(float s) { return _mm512_set1_ps(s); }
inline I splat_i(int s) { return _mm512_set1_epi32(s); }
inline F mul(F a, F b) { return _mm512_mul_ps(a, b); }
inline F add(F a, F b) { return _mm512_add_ps(a, b); }
inline F load(const float* p) { return _mm512_loadu_ps(p); }
inline F load(const at::BFloat16* p) {
  __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}
inline void store(float* p, F v) { _mm512_storeu_ps(p, v); }
inline void store(at::BFloat16* p, F v) {
  // v is a widened bfloat16 (or zero): its top half is the value.
  __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(v), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bits));
}
inline M greater(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
inline M unordered(F v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
inline M not_le_zero(F v) { return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLE_UQ); }
inline M either(M a, M b) { return a | b; }
inline M equal_i(I a, int b) { return _mm512_cmpeq_epi32_mask(a, _mm512_set1_epi32(b)); }
inline F blend(M m, F a, F b) { return _mm512_mask_blend_ps(m, a, b); }
inline I blend_i(M m, I a, I b) { return _mm512_mask_blend_epi32(m, a, b); }
inline F only(M m, F v) { return _mm512_maskz_mov_ps(m, v); }
// float32 bits to bfloat16's, rounded to nearest even, NaN kept NaN.
inline I rounded_bits(F v) {
  const I bits = _mm512_castps_si512(v);
  const I lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  I r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  return _mm512_mask_mov_epi32(r, unordered(v), _mm512_set1_epi32(0x7fc00000));
}
inline F as_f(I v) { return _mm512_castsi512_ps(v); }
// L codes (each 0-4) as bytes, and back.
inline void store_codes(uint8_t* p, I codes) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(codes));
}
inline I load_codes(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline F bytes_as_floats(const uint8_t* p) { return _mm512_cvtepi32_ps(load_codes(p)); }
#elif defined(__AVX2__)
constexpr int L = 8;
using F = __m256;
using I = __m256i;
using M = __m256;

inline F zero() { return _mm256_setzero_ps(); }
inline F splat(float s) { return _mm256_set1_ps(s); }
inline I splat_i(int s) { return _mm256_set1_epi32(s); }
inline F mul(F a, F b) { return _mm256_mul_ps(a, b); }
inline F add(F a, F b) { return _mm256_add_ps(a, b); }
inline F load(const float* p) { return _mm256_loadu_ps(p); }
inline F load(const at::BFloat16* p) {
  __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
inline void store(float* p, F v) { _mm256_storeu_ps(p, v); }
inline void store(at::BFloat16* p, F v) {
  // v is a widened bfloat16 (or zero): its top half is the value, 0-0xffff
  // once shifted down, which the unsigned pack keeps as it is.
  const __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
inline M greater(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
inline M unordered(F v) { return _mm256_cmp_ps(v, v, _CMP_UNORD_Q); }
inline M not_le_zero(F v) { return _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NLE_UQ); }
inline M either(M a, M b) { return _mm256_or_ps(a, b); }
inline M equal_i(I a, int b) { return _mm256_castsi256_ps(_mm256_cmpeq_epi32(a, _mm256_set1_epi32(b))); }
inline F blend(M m, F a, F b) { return _mm256_blendv_ps(a, b, m); }
inline I blend_i(M m, I a, I b) {
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), m));
}
inline F only(M m, F v) { return _mm256_and_ps(m, v); }
inline I rounded_bits(F v) {
  const I bits = _mm256_castps_si256(v);
  const I lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  I r = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  r = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
  return blend_i(unordered(v), r, _mm256_set1_epi32(0x7fc00000));
}
inline F as_f(I v) { return _mm256_castsi256_ps(v); }
inline void store_codes(uint8_t* p, I codes) {
  const __m128i words =
      _mm_packus_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(words, words));
}
inline I load_codes(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline F bytes_as_floats(const uint8_t* p) { return _mm256_cvtepi32_ps(load_codes(p)); }
#else
#error "the fused max-pool is built with -mavx512f -mavx512bw -mavx512vl or with -mavx2"
#endif

// float32 to bfloat16, to nearest with ties to even as c10::BFloat16 rounds
// (NaN stays NaN), returned widened: what bfloat16 ops compute in float32
// and store.
inline F round_bf16(F v) { return as_f(rounded_bits(v)); }

// v * s as a T op computes it: in float32, stored as T.
inline F times(F v, F s, float*) { return mul(v, s); }
inline F times(F v, F s, at::BFloat16*) { return round_bf16(mul(v, s)); }

// L mask bytes, one per channel c..c+L-1 of an NCHW mask (channel stride
// `stride`), as 1.0 or 0.0.
inline F mask_lanes(const bool* k, int64_t stride) {
  alignas(16) uint8_t bytes[16];
  for (int j = 0; j < L; ++j) bytes[j] = k[j * stride] ? 1 : 0;
  return bytes_as_floats(bytes);
}

// v replaces the maximum so far when v > it, or v is NaN.
inline M replaces(F v, F so_far) { return either(greater(v, so_far), unordered(v)); }

// L channels' 2x2 windows (rows r0 and r1, C apart along a row):
// relu(max), and a code each, 0-3 the winner in row-major order, 4 where
// the ReLU cut it.
struct Pooled {
  F value;
  I code;
};

template <typename T>
inline Pooled pool(const T* r0, const T* r1, int64_t C) {
  const F a = load(r0), b = load(r0 + C);
  const F d = load(r1), e = load(r1 + C);
  const M b_wins = replaces(b, a);
  const F top = blend(b_wins, a, b);
  const I top_at = blend_i(b_wins, splat_i(0), splat_i(1));
  const M e_wins = replaces(e, d);
  const F bottom = blend(e_wins, d, e);
  const I bottom_at = blend_i(e_wins, splat_i(2), splat_i(3));
  // The second row's winner replaces the first's as it would have in one
  // scan of the window.
  const M second = replaces(bottom, top);
  const F m = blend(second, top, bottom);
  const I at = blend_i(second, top_at, bottom_at);
  // ReLU keeps what is not <= 0 (NaN stays NaN; its gradient passes).
  const M keep = not_le_zero(m);
  return {only(keep, m), blend_i(keep, splat_i(4), at)};
}

// L channels' gradients v to their windows' winners (by code), zero
// to the rest, after + 0: aten adds each gradient into a zero-filled
// tensor, so a -0 (one that dropout zeroed) arrives as +0.
template <typename T>
inline void unpool(T* r0, T* r1, int64_t C, const uint8_t* code, F v) {
  v = add(v, zero());
  const I i = load_codes(code);
  store(r0, only(equal_i(i, 0), v));
  store(r0 + C, only(equal_i(i, 1), v));
  store(r1, only(equal_i(i, 2), v));
  store(r1 + C, only(equal_i(i, 3), v));
}
// x: N,C,H,W channels-last, C % L == 0, H and W even. Returns
// relu(max_pool2d(x, 2)) channels-last, and a code (N,H2,W2,C): pool's.
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
        for (int64_t c = 0; c < C; c += L) {
          const Pooled pooled = pool(r0 + c, r0 + W * C + c, C);
          store(o + c, pooled.value);
          store_codes(k + c, pooled.code);
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
        for (int64_t c = 0; c < C; c += L) {
          unpool(r0 + c, r0 + W * C + c, C, k + c, load(gg + c));
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
    const F sv = splat(s);
    alignas(64) T staged[L];
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t n = nh / H2, h2 = nh % H2;
      for (int64_t w2 = 0; w2 < W2; ++w2) {
        const T* r0 = xp + ((n * H + 2 * h2) * W + 2 * w2) * C;
        uint8_t* k = cp + ((n * H2 + h2) * W2 + w2) * C;
        for (int64_t c = 0; c < C; c += L) {
          const Pooled pooled = pool(r0 + c, r0 + W * C + c, C);
          F y = pooled.value;
          const int64_t first = (n * C + c) * HW2 + h2 * W2 + w2;  // channel c's output
          if (kp != nullptr) {
            // y * keep is exact (y or a zero of y's sign); then the scale, rounded as T.
            y = times(mul(y, mask_lanes(kp + first, HW2)), sv, staged);
          }
          store(staged, y);
          for (int j = 0; j < L; ++j) op[first + j * HW2] = staged[j];
          store_codes(k + c, pooled.code);
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
    const F sv = splat(s);
    alignas(64) T staged[L];
    for (int64_t nh = begin; nh < end; ++nh) {
      const int64_t n = nh / H2, h2 = nh % H2;
      for (int64_t w2 = 0; w2 < W2; ++w2) {
        T* r0 = xp + ((n * H + 2 * h2) * W + 2 * w2) * C;
        const uint8_t* k = cp + ((n * H2 + h2) * W2 + w2) * C;
        for (int64_t c = 0; c < C; c += L) {
          const int64_t first = (n * C + c) * HW2 + h2 * W2 + w2;
          for (int j = 0; j < L; ++j) staged[j] = gp[first + j * HW2];
          F v = load(staged);
          if (kp != nullptr) v = mul(times(v, sv, staged), mask_lanes(kp + first, HW2));
          unpool(r0 + c, r0 + W * C + c, C, k + c, v);
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
