// MetricsRegistry: metric families keyed by name, and their rendering in the Prometheus text
// exposition format 0.0.4.
//
// Programming errors at registration return nullptr (library code never aborts); callers that
// register fixed, literal names can treat nullptr as a bug caught by their tests:
//   - a name that is not a valid Prometheus metric name, or a label name that is invalid,
//     starts with "__", or is "le" on a histogram;
//   - a name already registered with another type, or one whose exposition would collide with
//     a histogram's series (histogram "x" owns "x_bucket", "x_sum" and "x_count");
//   - histogram bounds that are not finite and strictly increasing (+Inf is implied, leave it out).
// The help text of a family is the one given first; later differing help is ignored. The same
// name and labels return the same object; for a histogram the bounds given first stay.
#include <cmath>
#include <string_view>

#include "helios/metrics.h"
#include "metrics/text_format.h"

namespace helios {

namespace metrics_internal {
enum class MetricType { kCounter, kGauge, kHistogram };
}  // namespace metrics_internal
using metrics_internal::MetricType;

struct MetricsRegistry::Family {
  MetricType type;
  std::string help;
  // One map is used, chosen by `type`. std::map keeps samples in a stable, sorted order.
  std::map<MetricLabels, std::unique_ptr<Counter>> counters;
  std::map<MetricLabels, std::unique_ptr<Gauge>> gauges;
  std::map<MetricLabels, std::unique_ptr<Histogram>> histograms;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

namespace {

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

constexpr std::string_view kHistogramSuffixes[] = {"_bucket", "_sum", "_count"};

bool labels_valid(const MetricLabels& labels, MetricType type) {
  for (const auto& [key, value] : labels) {
    if (!metrics_text::valid_label_name(key)) return false;
    if (type == MetricType::kHistogram && key == "le") return false;
  }
  return true;
}

bool bounds_valid(const std::vector<double>& bounds) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) return false;
    if (i > 0 && !(bounds[i - 1] < bounds[i])) return false;
  }
  return true;
}

template <typename T, typename Make>
T* find_or_add(std::map<MetricLabels, std::unique_ptr<T>>& children, const MetricLabels& labels,
               Make make) {
  auto it = children.find(labels);
  if (it == children.end()) it = children.emplace(labels, make()).first;
  return it->second.get();
}

// Finds or creates the family `name` of `type`; nullptr on the errors listed at the top. Caller
// holds the registry's mutex. A template because Family is private to MetricsRegistry.
template <typename FamilyMap>
auto* find_or_add_family(FamilyMap& families, const std::string& name, const std::string& help,
                         MetricType type, const MetricLabels& labels) {
  using Family = typename FamilyMap::mapped_type::element_type;
  Family* none = nullptr;
  if (!metrics_text::valid_metric_name(name) || !labels_valid(labels, type)) return none;
  auto it = families.find(name);
  if (it != families.end()) return it->second->type == type ? it->second.get() : none;

  // A new family must not produce the same series names as an existing one.
  auto is_histogram = [&](const std::string& n) {
    auto h = families.find(n);
    return h != families.end() && h->second->type == MetricType::kHistogram;
  };
  for (std::string_view suffix : kHistogramSuffixes) {
    if (name.size() > suffix.size() && name.ends_with(suffix) &&
        is_histogram(name.substr(0, name.size() - suffix.size()))) {
      return none;
    }
    if (type == MetricType::kHistogram && families.count(name + std::string(suffix))) return none;
  }

  auto family = std::make_unique<Family>();
  family->type = type;
  family->help = help;
  return families.emplace(name, std::move(family)).first->second.get();
}

}  // namespace

Counter* MetricsRegistry::counter(const std::string& name, const std::string& help,
                                  const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family* f = find_or_add_family(families_, name, help, MetricType::kCounter, labels);
  if (!f) return nullptr;
  return find_or_add(f->counters, labels, [] { return std::make_unique<Counter>(); });
}

Gauge* MetricsRegistry::gauge(const std::string& name, const std::string& help,
                              const MetricLabels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  Family* f = find_or_add_family(families_, name, help, MetricType::kGauge, labels);
  if (!f) return nullptr;
  return find_or_add(f->gauges, labels, [] { return std::make_unique<Gauge>(); });
}

Histogram* MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      std::vector<double> upper_bounds, const MetricLabels& labels) {
  if (!bounds_valid(upper_bounds)) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  Family* f = find_or_add_family(families_, name, help, MetricType::kHistogram, labels);
  if (!f) return nullptr;
  return find_or_add(f->histograms, labels,
                     [&] { return std::make_unique<Histogram>(std::move(upper_bounds)); });
}

namespace {

void render_histogram(std::string& out, const std::string& name, const MetricLabels& labels,
                      const Histogram& h) {
  Histogram::Snapshot s = h.snapshot();
  for (size_t i = 0; i < s.cumulative_counts.size(); ++i) {
    double bound = i < s.upper_bounds.size() ? s.upper_bounds[i] : INFINITY;
    std::string le = "le=\"" + metrics_text::format_value(bound) + "\"";
    out += name + "_bucket" + metrics_text::render_labels(labels, le) + " " +
           std::to_string(s.cumulative_counts[i]) + "\n";
  }
  std::string rendered = metrics_text::render_labels(labels);
  out += name + "_sum" + rendered + " " + metrics_text::format_value(s.sum) + "\n";
  out += name + "_count" + rendered + " " + std::to_string(s.count) + "\n";
}

}  // namespace

// Families in name order, each as `# HELP`, `# TYPE`, then its samples in label order. A
// histogram's le label comes after its other labels, as the reference clients write it.
std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + metrics_text::escape_help(f->help) + "\n";
    out += "# TYPE " + name + " " + type_name(f->type) + "\n";
    for (const auto& [labels, c] : f->counters) {
      out += name + metrics_text::render_labels(labels) + " " + metrics_text::format_value(c->value()) + "\n";
    }
    for (const auto& [labels, g] : f->gauges) {
      out += name + metrics_text::render_labels(labels) + " " + metrics_text::format_value(g->value()) + "\n";
    }
    for (const auto& [labels, h] : f->histograms) render_histogram(out, name, labels, *h);
  }
  return out;
}

}  // namespace helios
