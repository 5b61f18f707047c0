#include "loadtest/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ridgeserve::loadtest {

double Percentile(const std::vector<double>& sorted, double q) {
  const double rank = q / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (rank - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

LatencyStats Describe(std::vector<double> values) {
  LatencyStats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.count = static_cast<int64_t>(values.size());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(s.count);
  s.p50 = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p95 = Percentile(values, 95);
  s.p99 = Percentile(values, 99);
  return s;
}

GroupSummary Summarize(const std::vector<const RequestRecord*>& records, double duration_s,
                       const Slo& slo) {
  GroupSummary g;
  g.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord* r : records) {
    ++g.num_requests;
    if (!r->ok()) {
      ++g.num_errors;
      ++g.errors_by_code[r->status_name];
      continue;
    }
    ++g.num_ok;
    g.prompt_tokens += r->server_prompt_tokens;
    g.output_tokens += r->output_tokens;
    if (r->ttft_s >= 0) ttft.push_back(r->ttft_s);
    if (r->tpot_s >= 0) tpot.push_back(r->tpot_s);
    itl.insert(itl.end(), r->itl_s.begin(), r->itl_s.end());
    e2e.push_back(r->e2e_s);
    const bool ttft_ok = slo.ttft_s <= 0 || (r->ttft_s >= 0 && r->ttft_s <= slo.ttft_s);
    const bool tpot_ok = slo.tpot_s <= 0 || r->tpot_s < 0 || r->tpot_s <= slo.tpot_s;
    if (ttft_ok && tpot_ok) ++g.num_good;
  }
  g.ttft = Describe(std::move(ttft));
  g.tpot = Describe(std::move(tpot));
  g.itl = Describe(std::move(itl));
  g.e2e = Describe(std::move(e2e));
  if (duration_s > 0) {
    g.request_throughput = static_cast<double>(g.num_ok) / duration_s;
    g.output_token_throughput = static_cast<double>(g.output_tokens) / duration_s;
    g.total_token_throughput = static_cast<double>(g.prompt_tokens + g.output_tokens) / duration_s;
    g.goodput = static_cast<double>(g.num_good) / duration_s;
  }
  return g;
}

std::map<std::string, GroupSummary> SummarizeByMode(
    const std::vector<const RequestRecord*>& records, double duration_s, const Slo& slo) {
  std::map<std::string, GroupSummary> out;
  out["all"] = Summarize(records, duration_s, slo);
  for (PrefillKind kind : kPrefillKinds) {
    std::vector<const RequestRecord*> subset;
    for (const RequestRecord* r : records) {
      if (r->mode == kind) subset.push_back(r);
    }
    if (!subset.empty()) out[PrefillKindName(kind)] = Summarize(subset, duration_s, slo);
  }
  return out;
}

}  // namespace ridgeserve::loadtest
