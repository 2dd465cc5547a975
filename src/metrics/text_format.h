// Pieces of the Prometheus text exposition format 0.0.4 shared by the registry's render() and
// the tests: number spelling, escaping, and name checks.
#pragma once

#include <string>
#include <string_view>

#include "helios/metrics.h"

namespace helios::metrics_text {

// A sample value as Prometheus parses it: "NaN", "+Inf", "-Inf"; integral values below 2^53 as
// plain integers ("3", not "3e+00"; -0 as "0"); anything else in the shortest form that reads
// back to the same double ("0.1", "1.5e-07", "1e+300").
std::string format_value(double v);

// Label value escaping: backslash, double quote and newline become \\, \" and \n.
std::string escape_label_value(std::string_view s);
// HELP text escaping: backslash and newline become \\ and \n (quotes stay as they are).
std::string escape_help(std::string_view s);

// Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*.
bool valid_metric_name(std::string_view s);
// Label names match [a-zA-Z_][a-zA-Z0-9_]* and must not start with "__" (reserved).
bool valid_label_name(std::string_view s);

// `{a="1",b="x\"y"}` in key order (MetricLabels is a sorted map), then `extra` (already
// rendered, e.g. `le="0.5"`) last; "" when there is nothing to render.
std::string render_labels(const MetricLabels& labels, std::string_view extra = {});

}  // namespace helios::metrics_text
