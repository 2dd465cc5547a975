// is_loopback_address and network_listeners: what heliosd's start-up warning about listeners
// open to the network without API keys is decided by.
#include <gtest/gtest.h>

#include "config_test_util.h"

namespace helios::testing {
namespace {

TEST(Loopback, LoopbackAddresses) {
  for (const char* address : {"127.0.0.1:50051", "127.0.0.1:0", "127.1.2.3:9090", "[::1]:50051",
                              "[0:0:0:0:0:0:0:1]:1", "[::ffff:127.0.0.1]:8000", "localhost:8000",
                              "LocalHost:1"}) {
    EXPECT_TRUE(is_loopback_address(address)) << address;
  }
}

TEST(Loopback, NetworkAddresses) {
  for (const char* address : {"0.0.0.0:50051", "[::]:50051", "192.168.1.20:50051", "10.0.0.1:9090",
                              "128.0.0.1:1", "[fe80::1]:1", "[::ffff:10.0.0.1]:1", "[::2]:1",
                              "myhost:50051", "localhost.example.com:1", "heliosd-0.helios:50051"}) {
    EXPECT_FALSE(is_loopback_address(address)) << address;
  }
}

TEST(Loopback, DefaultsAreLoopback) {
  EXPECT_EQ(ServerConfig{}.listen, "127.0.0.1:50051");
  EXPECT_TRUE(network_listeners(ServerConfig{}).empty());
}

TEST(Loopback, NetworkListenersNameEachOpenOne) {
  ServerConfig server;
  server.listen = "0.0.0.0:50051";
  server.http_listen = "127.0.0.1:8000";
  server.metrics_listen = "[::]:9090";
  EXPECT_EQ(network_listeners(server),
            (std::vector<std::string>{"server.listen 0.0.0.0:50051", "server.metrics_listen [::]:9090"}));
  server.http_listen = "192.168.0.2:8000";
  server.metrics_listen = "";  // off
  EXPECT_EQ(network_listeners(server),
            (std::vector<std::string>{"server.listen 0.0.0.0:50051", "server.http_listen 192.168.0.2:8000"}));
}

TEST(Loopback, ParsedConfigs) {
  StatusOr<HeliosConfig> config = parse_config(with_model("server:\n  http_listen: 0.0.0.0:8000\n"), "cfg.yaml");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_EQ(network_listeners(config->server), std::vector<std::string>{"server.http_listen 0.0.0.0:8000"});
  config = parse_config(with_model(""), "cfg.yaml");
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  EXPECT_TRUE(network_listeners(config->server).empty());
}

}  // namespace
}  // namespace helios::testing
