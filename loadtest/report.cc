#include "loadtest/report.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace ridgeserve::loadtest {
namespace {

using nlohmann::json;

std::vector<const RequestRecord*> Pointers(const std::vector<PhaseResult>& phases) {
  std::vector<const RequestRecord*> out;
  for (const PhaseResult& p : phases) {
    for (const RequestRecord& r : p.records) out.push_back(&r);
  }
  return out;
}

json ToJson(const LatencyStats& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"p50", s.p50},
          {"p90", s.p90},     {"p95", s.p95},   {"p99", s.p99}};
}

json ToJson(const std::map<std::string, GroupSummary>& by_mode) {
  json out = json::object();
  for (const auto& [mode, summary] : by_mode) out[mode] = ToJson(summary);
  return out;
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "\"\""}}), "\"");
}

void PrintGroup(const std::map<std::string, GroupSummary>& by_mode, std::FILE* out) {
  std::fprintf(out, "  %-10s %6s %6s %9s %11s %11s %10s\n", "mode", "ok", "errors", "req/s",
               "out tok/s", "total tok/s", "goodput/s");
  for (const auto& [mode, g] : by_mode) {
    std::fprintf(out, "  %-10s %6lld %6lld %9.3f %11.1f %11.1f %10.3f\n", mode.c_str(),
                 static_cast<long long>(g.num_ok), static_cast<long long>(g.num_errors),
                 g.request_throughput, g.output_token_throughput, g.total_token_throughput,
                 g.goodput);
  }
  std::fprintf(out, "  %-6s %-10s %10s %10s %10s %10s %10s  (ms)\n", "metric", "mode", "mean",
               "p50", "p90", "p95", "p99");
  const std::pair<const char*, LatencyStats GroupSummary::*> metrics[] = {
      {"TTFT", &GroupSummary::ttft},
      {"TPOT", &GroupSummary::tpot},
      {"ITL", &GroupSummary::itl},
      {"E2E", &GroupSummary::e2e}};
  for (const auto& [name, member] : metrics) {
    for (const auto& [mode, g] : by_mode) {
      const LatencyStats& s = g.*member;
      std::fprintf(out, "  %-6s %-10s %10.2f %10.2f %10.2f %10.2f %10.2f\n", name, mode.c_str(),
                   s.mean * 1e3, s.p50 * 1e3, s.p90 * 1e3, s.p95 * 1e3, s.p99 * 1e3);
    }
  }
  for (const auto& [mode, g] : by_mode) {
    if (g.errors_by_code.empty()) continue;
    std::string line;
    for (const auto& [code, n] : g.errors_by_code) absl::StrAppend(&line, " ", code, " ", n);
    std::fprintf(out, "  errors (%s):%s\n", mode.c_str(), line.c_str());
  }
}

}  // namespace

std::string PhaseLabel(const PhaseSpec& phase) {
  if (phase.arrival == "closed") return absl::StrCat("closed c=", phase.concurrency);
  std::string label = absl::StrFormat("%s %.2f req/s", phase.arrival, phase.rate);
  if (phase.arrival == "gamma") absl::StrAppendFormat(&label, " B=%.2f", phase.burstiness);
  return label;
}

std::map<std::string, GroupSummary> SummarizeRun(const RunReport& report) {
  double duration_s = 0;
  for (const PhaseResult& p : report.phases) duration_s += p.duration_s;
  return SummarizeByMode(Pointers(report.phases), duration_s, report.slo);
}

json ToJson(const GroupSummary& g) {
  return {{"num_requests", g.num_requests},
          {"num_ok", g.num_ok},
          {"num_errors", g.num_errors},
          {"errors", g.errors_by_code},
          {"ttft_seconds", ToJson(g.ttft)},
          {"tpot_seconds", ToJson(g.tpot)},
          {"itl_seconds", ToJson(g.itl)},
          {"e2e_seconds", ToJson(g.e2e)},
          {"prompt_tokens", g.prompt_tokens},
          {"output_tokens", g.output_tokens},
          {"duration_s", g.duration_s},
          {"request_throughput", g.request_throughput},
          {"output_token_throughput", g.output_token_throughput},
          {"total_token_throughput", g.total_token_throughput},
          {"goodput", {{"num_good", g.num_good}, {"requests_per_s", g.goodput}}}};
}

json ToJson(const RequestRecord& r) {
  return {{"index", r.index},
          {"phase", r.phase},
          {"request_id", r.request_id},
          {"mode", PrefillKindName(r.mode)},
          {"status", r.status_name},
          {"status_message", r.status_message},
          {"prompt_tokens", r.prompt_tokens},
          {"server_prompt_tokens", r.server_prompt_tokens},
          {"server_filled_prompt_tokens", r.server_filled_prompt_tokens},
          {"server_kept_prompt_tokens", r.server_kept_prompt_tokens},
          {"server_kept_kv_tokens", r.server_kept_kv_tokens},
          {"max_new_tokens", r.max_new_tokens},
          {"output_tokens", r.output_tokens},
          {"finish_reason", r.finish_reason},
          {"scheduled_at_s", r.scheduled_at_s},
          {"sent_at_s", r.sent_at_s},
          {"ttft_s", r.ttft_s},
          {"tpot_s", r.tpot_s},
          {"e2e_s", r.e2e_s},
          {"itl_s", r.itl_s},
          {"server_ttft_s", r.server_ttft_s},
          {"server_queue_s", r.server_queue_s}};
}

json ToJson(const RunReport& report) {
  json phases = json::array();
  int64_t sent = report.warmup_requests;
  for (const PhaseResult& p : report.phases) {
    std::vector<const RequestRecord*> records;
    for (const RequestRecord& r : p.records) records.push_back(&r);
    sent += static_cast<int64_t>(p.records.size());
    phases.push_back({{"arrival", p.spec.arrival},
                      {"rate", p.spec.rate},
                      {"burstiness", p.spec.burstiness},
                      {"concurrency", p.spec.concurrency},
                      {"num_requests_limit", p.spec.num_requests},
                      {"duration_limit_s", p.spec.duration_s},
                      {"started_at_s", p.started_at_s},
                      {"duration_s", p.duration_s},
                      {"summary", ToJson(SummarizeByMode(records, p.duration_s, report.slo))}});
  }
  std::vector<const RequestRecord*> all = Pointers(report.phases);
  std::sort(all.begin(), all.end(),
            [](const RequestRecord* a, const RequestRecord* b) { return a->index < b->index; });
  json requests = json::array();
  for (const RequestRecord* r : all) requests.push_back(ToJson(*r));
  return {
      {"config", report.config},
      {"model", report.model},
      {"slo", {{"ttft_s", report.slo.ttft_s}, {"tpot_s", report.slo.tpot_s}}},
      {"warmup", {{"num_requests", report.warmup_requests}, {"num_errors", report.warmup_errors}}},
      {"num_requests_sent", sent},
      {"summary", ToJson(SummarizeRun(report))},
      {"phases", phases},
      {"requests", requests}};
}

void PrintTable(const RunReport& report, std::FILE* out) {
  for (size_t i = 0; i < report.phases.size(); ++i) {
    const PhaseResult& p = report.phases[i];
    std::vector<const RequestRecord*> records;
    for (const RequestRecord& r : p.records) records.push_back(&r);
    std::fprintf(out, "== phase %zu/%zu: %s | %zu requests in %.2f s ==\n", i + 1,
                 report.phases.size(), PhaseLabel(p.spec).c_str(), p.records.size(), p.duration_s);
    PrintGroup(SummarizeByMode(records, p.duration_s, report.slo), out);
  }
  if (report.phases.size() > 1) {
    std::fprintf(out, "== all phases ==\n");
    PrintGroup(SummarizeRun(report), out);
  }
  if (report.slo.ttft_s > 0 || report.slo.tpot_s > 0) {
    std::fprintf(out,
                 "goodput: successful requests per second with TTFT <= %.0f ms and TPOT <= "
                 "%.0f ms (0 = no limit)\n",
                 report.slo.ttft_s * 1e3, report.slo.tpot_s * 1e3);
  }
  std::fflush(out);
}

absl::Status WriteJson(const RunReport& report, const std::string& path) {
  std::ofstream f(path);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  f << ToJson(report).dump(1) << "\n";
  if (!f) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

absl::Status WriteCsv(const RunReport& report, const std::string& path) {
  std::ofstream f(path);
  if (!f) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  f << "index,phase,request_id,mode,status,prompt_tokens,server_prompt_tokens,"
       "server_filled_prompt_tokens,server_kept_prompt_tokens,server_kept_kv_tokens,"
       "max_new_tokens,output_tokens,finish_reason,scheduled_at_s,sent_at_s,ttft_s,tpot_s,itl_mean_"
       "s,itl_max_s,e2e_s,server_ttft_s,server_queue_s,"
       "status_message\n";
  std::vector<const RequestRecord*> all = Pointers(report.phases);
  std::sort(all.begin(), all.end(),
            [](const RequestRecord* a, const RequestRecord* b) { return a->index < b->index; });
  for (const RequestRecord* r : all) {
    const LatencyStats itl = Describe(r->itl_s);
    const double itl_max =
        r->itl_s.empty() ? 0 : *std::max_element(r->itl_s.begin(), r->itl_s.end());
    f << absl::StrFormat(
        "%d,%d,%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%s,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%s\n",
        r->index, r->phase, CsvField(r->request_id), PrefillKindName(r->mode), r->status_name,
        r->prompt_tokens, r->server_prompt_tokens, r->server_filled_prompt_tokens,
        r->server_kept_prompt_tokens, r->server_kept_kv_tokens, r->max_new_tokens, r->output_tokens,
        r->finish_reason, r->scheduled_at_s, r->sent_at_s, r->ttft_s, r->tpot_s, itl.mean, itl_max,
        r->e2e_s, r->server_ttft_s, r->server_queue_s, CsvField(r->status_message));
  }
  if (!f) return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace ridgeserve::loadtest
