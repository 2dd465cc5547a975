// The arithmetic evaluator behind `helios chat --calculator`.
#include "common/calculator.h"

#include <gtest/gtest.h>

#include <cmath>

namespace helios {
namespace {

double eval(const char* e) {
  auto v = evaluate_arithmetic(e);
  EXPECT_TRUE(v.ok()) << e << ": " << v.status().to_string();
  return v.ok() ? *v : NAN;
}

std::string error(const char* e) {
  auto v = evaluate_arithmetic(e);
  EXPECT_FALSE(v.ok()) << e << " = " << (v.ok() ? *v : 0);
  return v.ok() ? "" : v.status().message();
}

TEST(Calculator, ArithmeticWithPrecedence) {
  EXPECT_EQ(eval("1 + 2 * 3"), 7);
  EXPECT_EQ(eval("(1 + 2) * 3"), 9);
  EXPECT_EQ(eval("10 - 4 - 3"), 3);   // left-associative
  EXPECT_EQ(eval("100 / 10 / 5"), 2);
  EXPECT_EQ(eval("2 ^ 3 ^ 2"), 512);  // right-associative
  EXPECT_EQ(eval("2 ** 10"), 1024);
  EXPECT_EQ(eval("2**3*2"), 16);
  EXPECT_DOUBLE_EQ(eval("7 / 2"), 3.5);
  EXPECT_DOUBLE_EQ(eval("0.1 + .2"), 0.1 + 0.2);
  EXPECT_EQ(eval("1e3 + 2.5E-1 * 4"), 1001);
  EXPECT_EQ(eval("  ( ( 42 ) ) "), 42);
  EXPECT_EQ(eval("1,000 * 3"), 3000);
}

TEST(Calculator, UnaryMinus) {
  EXPECT_EQ(eval("-3 + 5"), 2);
  EXPECT_EQ(eval("--3"), 3);
  EXPECT_EQ(eval("-2 ^ 2"), -4);      // power binds tighter
  EXPECT_EQ(eval("(-2) ^ 2"), 4);
  EXPECT_EQ(eval("2 ^ -1"), 0.5);
  EXPECT_EQ(eval("4 * -(1 + 1)"), -8);
  EXPECT_EQ(eval("+7"), 7);
}

TEST(Calculator, ErrorsSayWhat) {
  EXPECT_EQ(error("1 / 0"), "division by zero");
  EXPECT_EQ(error("1 / (2 - 2)"), "division by zero");
  EXPECT_EQ(error(""), "the expression is empty");
  EXPECT_EQ(error("   "), "the expression is empty");
  EXPECT_EQ(error("1 +"), "the expression ends too early");
  EXPECT_EQ(error("(1 + 2"), "a '(' is never closed");
  EXPECT_EQ(error("1 + 2)"), "unexpected ')' at 6");
  EXPECT_EQ(error("2 x 3"), "unexpected 'x' at 3");
  EXPECT_EQ(error("abc"), "unexpected 'a' at 1");
  EXPECT_EQ(error("(-8) ^ 0.5"), "the power has no real value");
  EXPECT_EQ(error("10 ^ 400"), "the result is not a finite number");
  EXPECT_EQ(error("."), "unexpected '.' at 1");
  std::string deep(1000, '-');
  deep += "1";
  EXPECT_EQ(error(deep.c_str()), "the expression nests too deeply");
}

TEST(Calculator, FormatsNumbersAsPeopleWriteThem) {
  EXPECT_EQ(format_number(42), "42");
  EXPECT_EQ(format_number(-7), "-7");
  EXPECT_EQ(format_number(-0.0), "0");
  EXPECT_EQ(format_number(3.5), "3.5");
  EXPECT_EQ(format_number(1.0 / 3), "0.333333333333");
  EXPECT_EQ(format_number(123456789012345.0), "123456789012345");
  EXPECT_EQ(format_number(1.5e20), "1.5e+20");
  EXPECT_EQ(format_number(0.1 + 0.2), "0.3");
}

}  // namespace
}  // namespace helios
