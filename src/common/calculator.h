// A small arithmetic evaluator: the tool behind `helios chat --calculator`.
//   + - * /, ^ or ** (power, right-associative, binding tighter than unary minus: -2^2 = -4),
//   parentheses, unary + and -, decimal numbers (1, 2.5, .5, 1e3). Spaces are ignored, and so
//   are thousands separators written as commas between digits (1,000).
#pragma once

#include <string>
#include <string_view>

#include "helios/status.h"

namespace helios {

// The value of `expression`; INVALID_ARGUMENT saying what is wrong and where ("division by zero",
// "unexpected ')' at 5", "the result is not a finite number").
StatusOr<double> evaluate_arithmetic(std::string_view expression);

// A result as a person writes it: integers without a decimal point (up to 1e15), others with up to
// 12 significant digits ("0.333333333333", "1.5e+20").
std::string format_number(double value);

}  // namespace helios
