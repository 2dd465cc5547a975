// server: listen, metrics_listen, http_listen, http_threads, tls {cert, key}, api_keys, drain_timeout_s,
// liveness_timeout_s; and which listeners are reachable from the network (heliosd warns about them
// without API keys).
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <utility>

#include "config/sections.h"

namespace helios::config_detail {

namespace {

constexpr std::string_view kHostPortHelp =
    "expected HOST:PORT with PORT 0..65535 (0 = any free port), e.g. 0.0.0.0:50051, "
    "localhost:9090 or [::]:50051";

bool is_host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
}

Status read_tls(const MapReader& server, ServerConfig* out) {
  const YAML::Node tls_node = server.has("tls") ? server.value("tls") : YAML::Node();
  HELIOS_ASSIGN_OR_RETURN(MapReader tls, MapReader::open(server.source(), tls_node,
                                                         server.mark_of("tls"), "server.tls",
                                                         {"cert", "key"}));
  HELIOS_RETURN_IF_ERROR(tls.read_string("cert", &out->tls_cert_path));
  HELIOS_RETURN_IF_ERROR(tls.read_string("key", &out->tls_key_path));
  if (!out->tls_cert_path.empty() && out->tls_key_path.empty()) {
    return tls.error("cert", "is set but server.tls.key is not; set both (TLS on) or neither "
                             "(plaintext)");
  }
  if (out->tls_cert_path.empty() && !out->tls_key_path.empty()) {
    return tls.error("key", "is set but server.tls.cert is not; set both (TLS on) or neither "
                            "(plaintext)");
  }
  if (!out->tls_cert_path.empty()) {
    out->tls_cert_path = resolve_path(server.source(), out->tls_cert_path);
    out->tls_key_path = resolve_path(server.source(), out->tls_key_path);
  }
  return ok_status();
}

Status check_api_keys(const MapReader& server, const std::vector<std::string>& keys) {
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& key = keys[i];
    const bool printable = std::all_of(key.begin(), key.end(), [](char c) {
      return std::isgraph(static_cast<unsigned char>(c)) != 0;
    });
    if (key.empty() || !printable) {
      const YAML::Node item = server.value("api_keys")[i];
      return config_error(server.source(), item.Mark(),
                          "server.api_keys[" + std::to_string(i) + "]",
                          "must be a non-empty string of printable characters without spaces "
                          "(it is sent as 'authorization: Bearer <key>')");
    }
  }
  return ok_status();
}

}  // namespace

std::string host_port_problem(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return std::string(kHostPortHelp);
  const std::string_view host = address.substr(0, colon);
  const std::string_view port = address.substr(colon + 1);
  if (host.empty()) return std::string(kHostPortHelp);
  if (host.front() == '[') {
    // IPv6 literal: [hex and colons, maybe a dotted IPv4 tail].
    if (host.size() < 3 || host.back() != ']') return std::string(kHostPortHelp);
    const std::string_view inside = host.substr(1, host.size() - 2);
    for (char c : inside) {
      if (!std::isxdigit(static_cast<unsigned char>(c)) && c != ':' && c != '.') {
        return std::string(kHostPortHelp);
      }
    }
  } else {
    if (host.find(':') != std::string_view::npos) {
      return "an IPv6 host needs brackets, e.g. [::1]:50051";
    }
    if (!std::all_of(host.begin(), host.end(), is_host_char)) return std::string(kHostPortHelp);
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }) ||
      std::stoi(std::string(port)) > 65535) {
    return std::string(kHostPortHelp);
  }
  return "";
}

Status read_server_config(const ConfigSource& source, const YAML::Node& node,
                          const YAML::Mark& where, ServerConfig* out) {
  HELIOS_ASSIGN_OR_RETURN(
      MapReader server,
      MapReader::open(source, node, where, "server",
                      {"listen", "metrics_listen", "http_listen", "http_threads", "tls", "api_keys",
                       "drain_timeout_s", "liveness_timeout_s"}));

  HELIOS_RETURN_IF_ERROR(server.read_string("listen", &out->listen));
  if (std::string problem = host_port_problem(out->listen); !problem.empty()) {
    return server.error("listen", problem + ", got '" + out->listen + "'");
  }

  HELIOS_RETURN_IF_ERROR(server.read_string("metrics_listen", &out->metrics_listen));
  if (!out->metrics_listen.empty()) {
    if (std::string problem = host_port_problem(out->metrics_listen); !problem.empty()) {
      return server.error("metrics_listen",
                          problem + ", or \"\" for no metrics endpoint, got '" +
                              out->metrics_listen + "'");
    }
    if (out->metrics_listen == out->listen) {
      return server.error("metrics_listen", "is the same address as server.listen ('" +
                                                out->listen + "'); give it another port");
    }
  }

  HELIOS_RETURN_IF_ERROR(server.read_string("http_listen", &out->http_listen));
  if (!out->http_listen.empty()) {
    if (std::string problem = host_port_problem(out->http_listen); !problem.empty()) {
      return server.error("http_listen",
                          problem + ", or \"\" for no HTTP (OpenAI) API, got '" + out->http_listen + "'");
    }
    // Port 0 (any free port) never clashes.
    const bool any_port = out->http_listen.ends_with(":0");
    if (!any_port && out->http_listen == out->listen) {
      return server.error("http_listen", "is the same address as server.listen ('" + out->listen +
                                             "'); give it another port");
    }
    if (!any_port && out->http_listen == out->metrics_listen) {
      return server.error("http_listen", "is the same address as server.metrics_listen ('" +
                                             out->metrics_listen + "'); give it another port");
    }
  }
  HELIOS_RETURN_IF_ERROR(server.read_int("http_threads", &out->http_threads));
  if (out->http_threads < 2 || out->http_threads > 1024) {
    return server.error("http_threads", "must be in 2..1024 (each open HTTP connection holds one), got " +
                                            std::to_string(out->http_threads));
  }

  HELIOS_RETURN_IF_ERROR(read_tls(server, out));

  HELIOS_RETURN_IF_ERROR(server.read_string_list("api_keys", &out->api_keys));
  HELIOS_RETURN_IF_ERROR(check_api_keys(server, out->api_keys));

  HELIOS_RETURN_IF_ERROR(server.read_double("drain_timeout_s", &out->drain_timeout_s));
  if (out->drain_timeout_s < 0) {
    return server.error("drain_timeout_s", "must be at least 0 seconds, got " +
                                               server.value("drain_timeout_s").Scalar());
  }

  HELIOS_RETURN_IF_ERROR(server.read_double("liveness_timeout_s", &out->liveness_timeout_s));
  if (!(out->liveness_timeout_s >= 0) || out->liveness_timeout_s > 86400) {
    return server.error("liveness_timeout_s", "must be in 0..86400 seconds (0 = no liveness watchdog), got " +
                                                  server.value("liveness_timeout_s").Scalar());
  }
  return ok_status();
}

}  // namespace helios::config_detail

namespace helios {

bool is_loopback_address(std::string_view address) {
  const size_t colon = address.rfind(':');
  std::string host(address.substr(0, colon == std::string_view::npos ? address.size() : colon));
  std::transform(host.begin(), host.end(), host.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    const std::string inside = host.substr(1, host.size() - 2);
    in6_addr v6{};
    if (inet_pton(AF_INET6, inside.c_str(), &v6) != 1) return false;
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;  // another host name: it may resolve to any address
}

std::vector<std::string> network_listeners(const ServerConfig& server) {
  std::vector<std::string> out;
  const std::pair<const char*, const std::string*> listeners[] = {
      {"server.listen", &server.listen},
      {"server.http_listen", &server.http_listen},
      {"server.metrics_listen", &server.metrics_listen}};
  for (const auto& [key, address] : listeners) {
    if (!address->empty() && !is_loopback_address(*address)) out.push_back(std::string(key) + " " + *address);
  }
  return out;
}

}  // namespace helios
