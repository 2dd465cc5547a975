// Exit profiles (include/helios/exit_profile.h): counting over observations, and the Markdown and
// JSON they are shown as.
#include "helios/exit_profile.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "kernels/kernels.h"

namespace helios {
namespace {

constexpr float kThresholds[] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 0.95f, 0.99f};
constexpr int kBins = 10;

// For each threshold: the tokens whose confidence reaches it, and the share of them that agree.
std::vector<ThresholdRow> threshold_rows(const std::vector<float>& confidence, const std::vector<uint8_t>& agrees) {
  std::vector<ThresholdRow> out;
  for (float t : kThresholds) {
    int64_t leaving = 0, agreed = 0;
    for (size_t i = 0; i < confidence.size(); ++i) {
      if (confidence[i] < t) continue;
      ++leaving;
      agreed += agrees[i];
    }
    const auto n = static_cast<double>(std::max<size_t>(confidence.size(), 1));
    out.push_back({t, leaving / n, leaving ? static_cast<double>(agreed) / static_cast<double>(leaving) : 1.0});
  }
  return out;
}

// "| exit |" + extra columns + one column per threshold, and the alignment row.
std::string threshold_header(const std::string& extra, const std::string& extra_align) {
  std::string head = "| exit |" + extra, align = "|---:|" + extra_align;
  for (float t : kThresholds) {
    char h[16];
    std::snprintf(h, sizeof h, " %g |", t);
    head += h;
    align += "---:|";
  }
  return head + "\n" + align + "\n";
}

std::string percent(double x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * x);
  return buf;
}

}  // namespace

void ExitObservations::add_pass(const ForwardResult& fr) {
  if (layers.empty()) layers = fr.observed_layers;
  for (size_t row = 0; row < fr.row_seq.size(); ++row) {
    std::vector<ExitObservation> seen;
    bool complete = fr.observed_layers == layers;
    for (const auto& layer : fr.observed) {
      seen.push_back(layer[row]);
      complete = complete && layer[row].top1 >= 0;
    }
    if (!complete) continue;
    const float* logits = fr.row(row);
    exits.push_back(std::move(seen));
    final_top1.push_back(kernels::ref_argmax(logits, fr.n_vocab));
  }
}

ExitProfile build_exit_profile(const ExitObservations& obs, const std::string& mode, const ExitHeadSet* heads) {
  ExitProfile profile;
  profile.mode = mode;
  for (size_t e = 0; e < obs.layers.size(); ++e) {
    ExitLayerProfile lp;
    lp.layer = obs.layers[e];
    lp.n = obs.n_tokens();
    std::vector<float> prob(lp.n), calibrated(lp.n);
    std::vector<uint8_t> agrees(lp.n);
    const ExitHeadParams* head = heads ? heads->find(lp.layer) : nullptr;
    int64_t agreed = 0;
    std::vector<int64_t> bin_n(kBins, 0), bin_same(kBins, 0);
    for (int64_t i = 0; i < lp.n; ++i) {
      const ExitObservation& o = obs.exits[i][e];
      prob[i] = o.top1_prob;
      agrees[i] = o.top1 == obs.final_top1[i];
      agreed += agrees[i];
      if (head) calibrated[i] = agreement_confidence(*head, o.top1_prob);
      const int b = std::clamp(static_cast<int>(o.top1_prob * kBins), 0, kBins - 1);
      ++bin_n[b];
      bin_same[b] += agrees[i];
    }
    lp.agreement = lp.n ? static_cast<double>(agreed) / static_cast<double>(lp.n) : 0.0;
    lp.top1 = threshold_rows(prob, agrees);
    if (head && !head->curve_prob.empty()) lp.agreement_measure = threshold_rows(calibrated, agrees);
    for (int b = 0; b < kBins; ++b) {
      lp.bins.push_back({static_cast<float>(b) / kBins, static_cast<float>(b + 1) / kBins, bin_n[b],
                         bin_n[b] ? static_cast<double>(bin_same[b]) / static_cast<double>(bin_n[b]) : 0.0});
    }
    profile.layers.push_back(std::move(lp));
  }
  return profile;
}

std::string exit_profile_markdown(const std::vector<ExitProfile>& profiles) {
  std::string out;
  for (const ExitProfile& p : profiles) {
    const int64_t n = p.layers.empty() ? 0 : p.layers[0].n;
    out += "## " + p.mode + " (" + std::to_string(n) + " tokens)\n\n";
    out += "Top-1 agreement with the last layer, and at each top-1 threshold the share of tokens that would leave "
           "/ the share of those that agree:\n\n" + threshold_header(" agreement |", "---:|");
    for (const ExitLayerProfile& l : p.layers) {
      out += "| " + std::to_string(l.layer) + " | " + percent(l.agreement) + " |";
      for (const ThresholdRow& r : l.top1) out += " " + percent(r.leaving) + " / " + percent(r.agreed) + " |";
      out += "\n";
    }
    bool any_curve = false;
    for (const ExitLayerProfile& l : p.layers) any_curve = any_curve || !l.agreement_measure.empty();
    if (any_curve) {
      out += "\nThe same by the `agreement` measure (each exit's calibrated curve): leaving / agreed:\n\n" +
             threshold_header("", "");
      for (const ExitLayerProfile& l : p.layers) {
        if (l.agreement_measure.empty()) continue;
        out += "| " + std::to_string(l.layer) + " |";
        for (const ThresholdRow& r : l.agreement_measure) out += " " + percent(r.leaving) + " / " + percent(r.agreed) + " |";
        out += "\n";
      }
    }
    out += "\nThe paper's curve: of the tokens whose exit top-1 probability is in each bin, the share whose "
           "prediction is unchanged at the last layer (tokens in the bin):\n\n| exit |";
    for (int b = 0; b < kBins; ++b) {
      char h[24];
      std::snprintf(h, sizeof h, " %.1f–%.1f |", static_cast<double>(b) / kBins, static_cast<double>(b + 1) / kBins);
      out += h;
    }
    out += "\n|---:|";
    for (int b = 0; b < kBins; ++b) out += "---:|";
    out += "\n";
    for (const ExitLayerProfile& l : p.layers) {
      out += "| " + std::to_string(l.layer) + " |";
      for (const ConfidenceBin& b : l.bins) {
        out += b.n ? " " + percent(b.unchanged) + " (" + std::to_string(b.n) + ") |" : " - (0) |";
      }
      out += "\n";
    }
    out += "\n";
  }
  return out;
}

std::string exit_profile_json(const std::vector<ExitProfile>& profiles) {
  nlohmann::json out = nlohmann::json::array();
  auto rows = [](const std::vector<ThresholdRow>& v) {
    nlohmann::json a = nlohmann::json::array();
    for (const ThresholdRow& r : v) a.push_back({{"threshold", r.threshold}, {"leaving", r.leaving}, {"agreed", r.agreed}});
    return a;
  };
  for (const ExitProfile& p : profiles) {
    nlohmann::json layers = nlohmann::json::array();
    for (const ExitLayerProfile& l : p.layers) {
      nlohmann::json bins = nlohmann::json::array();
      for (const ConfidenceBin& b : l.bins) {
        bins.push_back({{"low", b.low}, {"high", b.high}, {"n", b.n}, {"unchanged", b.unchanged}});
      }
      layers.push_back({{"layer", l.layer}, {"n", l.n}, {"agreement", l.agreement}, {"top1_thresholds", rows(l.top1)},
                        {"agreement_thresholds", rows(l.agreement_measure)}, {"bins", bins}});
    }
    out.push_back({{"mode", p.mode}, {"layers", layers}});
  }
  return out.dump(2) + "\n";
}

}  // namespace helios
