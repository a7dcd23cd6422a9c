#include "tokenizer/jinja_arith.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "tokenizer/jinja_value.h"

namespace xds::jinja {
namespace {

[[noreturn]] void overflow(int64_t a, const char* op, int64_t b) {
  throw TemplateError(fmt::format("integer overflow in {} {} {}", a, op, b));
}

}  // namespace

int64_t int_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow(a, "+", b);
  return r;
}

int64_t int_sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow(a, "-", b);
  return r;
}

int64_t int_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow(a, "*", b);
  return r;
}

int64_t int_neg(int64_t a) {
  return int_sub(0, a);
}

int64_t int_abs(int64_t a) {
  return a < 0 ? int_neg(a) : a;
}

int64_t int_floordiv(int64_t a, int64_t b) {
  if (a == std::numeric_limits<int64_t>::min() && b == -1) overflow(a, "//", b);
  int64_t q = a / b;
  if (a % b != 0 && ((a % b < 0) != (b < 0))) --q;
  return q;
}

int64_t int_mod(int64_t a, int64_t b) {
  if (b == -1) return 0;  // also for INT64_MIN, where a % b itself would overflow
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

int64_t int_pow(int64_t a, int64_t b) {
  int64_t result = 1;
  int64_t base = a;
  const int64_t exp = b;
  while (b > 0) {
    if (b & 1) {
      if (__builtin_mul_overflow(result, base, &result)) overflow(a, "**", exp);
    }
    b >>= 1;
    if (b > 0 && __builtin_mul_overflow(base, base, &base)) {
      // base * base overflows; only base 0, 1 and -1 could have gone on, and they never do.
      overflow(a, "**", exp);
    }
  }
  return result;
}

bool fits_int64(double d) {
  return d >= -0x1p63 && d < 0x1p63;
}

}  // namespace xds::jinja
