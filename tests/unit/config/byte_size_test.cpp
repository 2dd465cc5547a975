#include <gtest/gtest.h>

#include "helios/config.h"

namespace helios {
namespace {

int64_t bytes(const std::string& text) {
  StatusOr<int64_t> parsed = parse_byte_size(text);
  EXPECT_TRUE(parsed.ok()) << text << ": " << parsed.status().to_string();
  return parsed.ok() ? *parsed : -1;
}

TEST(ConfigByteSize, PlainBytes) {
  EXPECT_EQ(bytes("0"), 0);
  EXPECT_EQ(bytes("1073741824"), 1073741824);
  EXPECT_EQ(bytes("100B"), 100);
}

TEST(ConfigByteSize, BinaryUnits) {
  EXPECT_EQ(bytes("1KiB"), 1024);
  EXPECT_EQ(bytes("512MiB"), 512LL << 20);
  EXPECT_EQ(bytes("2GiB"), 2LL << 30);
  EXPECT_EQ(bytes("1TiB"), 1LL << 40);
}

TEST(ConfigByteSize, DecimalUnits) {
  EXPECT_EQ(bytes("1KB"), 1000);
  EXPECT_EQ(bytes("2MB"), 2000000);
  EXPECT_EQ(bytes("2GB"), 2000000000);
  EXPECT_EQ(bytes("3TB"), 3000000000000);
}

TEST(ConfigByteSize, CaseSpacesAndFractions) {
  EXPECT_EQ(bytes("2gib"), 2LL << 30);
  EXPECT_EQ(bytes("2 GiB"), 2LL << 30);
  EXPECT_EQ(bytes(" 4096 "), 4096);
  EXPECT_EQ(bytes("1.5GiB"), 3LL << 29);
  EXPECT_EQ(bytes("0.5KB"), 500);
}

TEST(ConfigByteSize, Rejects) {
  for (const char* text : {"", "GiB", "12XB", "-1", "-1GiB", "1.2.3MB", "1.3B", "abc", "1e9",
                           "99999999999999999999", "9000000TiB", "2 G i B"}) {
    StatusOr<int64_t> parsed = parse_byte_size(text);
    EXPECT_FALSE(parsed.ok()) << "'" << text << "' parsed as " << (parsed.ok() ? *parsed : 0);
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(parsed.status().message().find(std::string("'") + text + "'"), std::string::npos)
          << parsed.status().message();
    }
  }
}

TEST(ConfigByteSize, ErrorSaysWhatIsValid) {
  StatusOr<int64_t> parsed = parse_byte_size("12XB");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(),
            "'12XB' is not a size: expected a number of bytes with an optional unit: B, KB, MB, "
            "GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 512MiB or 2GB");
}

}  // namespace
}  // namespace helios
