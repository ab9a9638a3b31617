// bf16 / fp16 <-> float with round-to-nearest-even, written out so the CPU references do not
// need cuda_fp16.h or cuda_bf16.h.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kvpage/kernel_reference.h"

namespace kvpage::ref {
namespace {

uint32_t FloatBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

float BitsFloat(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

}  // namespace

uint16_t FloatToBf16(float x) {
  const uint32_t bits = FloatBits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // keep NaN a (quiet) NaN
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float Bf16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToF16(float x) {
  const uint32_t bits = FloatBits(x);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  // 65520 is the midpoint between the largest half (65504) and 2^16: it and everything above
  // round to infinity.
  if (abs_bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (abs_bits < 0x38800000u) {
    // Below 2^-14: a subnormal half, i.e. an integer multiple of 2^-24. Scaling by 2^24 is
    // exact, and nearbyint rounds half to even in the default rounding mode. A result of 1024
    // is the smallest normal half, which the same encoding already expresses.
    const float scaled = BitsFloat(abs_bits) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  const uint32_t exponent = (abs_bits >> 23) - 127u + 15u;
  const uint32_t mantissa = abs_bits & 0x7fffffu;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
  return static_cast<uint16_t>(sign | half);
}

float F16ToFloat(uint16_t bits) {
  const uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return BitsFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsFloat(sign | ((exponent - 15u + 127u) << 23) | (mantissa << 13));
}

uint8_t FloatToE4m3(float x) {
  const uint32_t bits = FloatBits(x);
  const uint8_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return 0x7f;
  const float a = BitsFloat(abs_bits);
  if (a > 448.0f) return sign | 0x7e;  // satfinite: the largest finite value
  if (a < 0x1p-6f) {
    // Subnormal e4m3: a multiple of 2^-9 (exact scaling, ties to even). 8 is the smallest
    // normal (exponent field 1, mantissa 0), which the same encoding expresses.
    return static_cast<uint8_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 512.0f)));
  }
  const uint32_t exponent = (abs_bits >> 23) - 127u + 7u;  // 1..8+7
  const uint32_t mantissa = abs_bits & 0x7fffffu;
  uint32_t code = (exponent << 3) | (mantissa >> 20);
  const uint32_t rest = mantissa & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;
  if (code > 0x7eu) code = 0x7e;  // 448 < a rounds no higher than 448 after the check above
  return static_cast<uint8_t>(sign | code);
}

float E4m3ToFloat(uint8_t bits) {
  const uint32_t exponent = (bits >> 3) & 0xfu;
  const uint32_t mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0x1p-9f;
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f,
                           static_cast<int>(exponent) - 7);
  }
  return (bits & 0x80u) ? -magnitude : magnitude;
}

float HalfToFloat(uint16_t bits, DType dtype) {
  return dtype == DType::kBF16 ? Bf16ToFloat(bits) : F16ToFloat(bits);
}

uint16_t FloatToHalf(float x, DType dtype) {
  return dtype == DType::kBF16 ? FloatToBf16(x) : FloatToF16(x);
}

}  // namespace kvpage::ref
