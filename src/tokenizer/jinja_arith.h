// Integer arithmetic of the Jinja subset. Python's integers do not overflow; ours are int64_t,
// so an operation whose result does not fit fails with a TemplateError ("integer overflow in
// 2 ** 64") instead of being undefined behaviour. Division and modulo floor, as in Python.
// Pure; thread-safe.
#pragma once

#include <cstdint>

namespace xds::jinja {

int64_t int_add(int64_t a, int64_t b);
int64_t int_sub(int64_t a, int64_t b);
int64_t int_mul(int64_t a, int64_t b);
int64_t int_neg(int64_t a);
int64_t int_abs(int64_t a);
// a // b and a % b (b != 0; the caller reports division by zero).
int64_t int_floordiv(int64_t a, int64_t b);
int64_t int_mod(int64_t a, int64_t b);
// a ** b for b >= 0, by squaring (64 multiplications at most, whatever b).
int64_t int_pow(int64_t a, int64_t b);
// Whether `d` (a whole number or not) converts to int64_t: -2^63 <= d < 2^63, not NaN.
bool fits_int64(double d);

}  // namespace xds::jinja
