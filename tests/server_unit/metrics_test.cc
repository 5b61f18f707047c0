// ServerMetrics and RequestMetrics fed with hand-made engine events (no model, no engine): each
// request is counted once, in requests_total or request_errors_total, with its prefill mode;
// TTFT, ITL and token counters follow the events; RidgeFill counters only for filled rows,
// SpecPC and SpecKV ones only for requests whose budget is below the prompt;
// engine gauges are read at scrape time; /metrics is served over HTTP on a free port.
#include "server/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ridgeserve {
namespace {

// The value of the series written exactly as `series` (name{labels}) in the text format; -1
// when absent.
double Value(const std::string& text, const std::string& series) {
  const std::string key = series + " ";
  size_t pos = 0;
  while ((pos = text.find(key, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + key.size()));
    pos += key.size();
  }
  return -1;
}

ServerMetrics::BuildInfo Info() { return {"1.2.3", "tiny", "cpu", 2}; }

EngineStats Idle() {
  EngineStats s;
  s.kv_blocks_total = 100;
  s.kv_blocks_free = 100;
  return s;
}

TokenEvent Token(int32_t split_layer = -1) {
  TokenEvent e;
  e.tokens = {7};
  e.prompt_tokens = 50;
  e.split_layer = split_layer;
  e.timing.ttft_seconds = 0.25;
  if (split_layer >= 0) {
    e.filled_prompt_tokens = 40;
    e.exact_prompt_tokens = 10;
    e.skipped_layer_tokens = 40 * 7;
    e.timing.estimated_ttft_saved_seconds = 0.125;
  }
  return e;
}

TokenEvent Final(TokenEvent e, absl::Status status = absl::OkStatus()) {
  e.tokens.clear();
  e.finished = true;
  e.finish_reason = FinishReason::kLength;
  e.status = std::move(status);
  e.timing.queue_seconds = 0.5;
  e.timing.prefill_seconds = 0.75;
  e.timing.e2e_seconds = 2;
  return e;
}

TEST(ServerMetricsTest, ExactRequestCountedOnceWithItsTokens) {
  ServerMetrics metrics(Idle, Info());
  RequestMetrics request(metrics, EngineRequest{});
  for (int i = 0; i < 4; ++i) request.OnEvent(Token(), v1::FINISH_REASON_UNSPECIFIED);
  request.OnEvent(Final(Token()), v1::LENGTH);
  request.OnEvent(Final(Token()), v1::LENGTH);  // a second final event changes nothing
  const std::string text = metrics.Render();
  EXPECT_EQ(
      Value(text, R"(ridgeserve_requests_total{finish_reason="length",prefill_mode="exact"})"), 1);
  EXPECT_EQ(
      Value(text, R"(ridgeserve_requests_total{finish_reason="length",prefill_mode="ridgefill"})"),
      0);
  EXPECT_EQ(Value(text, R"(ridgeserve_time_to_first_token_seconds_count{prefill_mode="exact"})"),
            1);
  EXPECT_EQ(Value(text, R"(ridgeserve_time_to_first_token_seconds_sum{prefill_mode="exact"})"),
            0.25);
  EXPECT_EQ(Value(text, R"(ridgeserve_inter_token_latency_seconds_count{prefill_mode="exact"})"),
            3);
  EXPECT_EQ(Value(text, R"(ridgeserve_e2e_request_latency_seconds_sum{prefill_mode="exact"})"), 2);
  EXPECT_EQ(Value(text, R"(ridgeserve_request_queue_time_seconds_sum{prefill_mode="exact"})"), 0.5);
  EXPECT_EQ(Value(text, R"(ridgeserve_request_prefill_time_seconds_sum{prefill_mode="exact"})"),
            0.75);
  // TTFT 0.25 s lands in vLLM's (0.1, 0.25] bucket.
  EXPECT_EQ(
      Value(text,
            R"(ridgeserve_time_to_first_token_seconds_bucket{prefill_mode="exact",le="0.1"})"),
      0);
  EXPECT_EQ(
      Value(text,
            R"(ridgeserve_time_to_first_token_seconds_bucket{prefill_mode="exact",le="0.25"})"),
      1);
  EXPECT_EQ(Value(text, "ridgeserve_prompt_tokens_total"), 50);
  EXPECT_EQ(Value(text, "ridgeserve_generation_tokens_total"), 4);
  EXPECT_EQ(Value(text, "ridgeserve_ridgefill_ttft_saved_seconds_count"), 0);
  EXPECT_EQ(Value(text, "ridgeserve_ridgefill_filled_tokens_total"), 0);
}

TEST(ServerMetricsTest, ShadowComparisonsBySplitLayer) {
  ServerMetrics metrics(Idle, Info());
  EXPECT_EQ(Value(metrics.Render(), R"(ridgeserve_ridgefill_shadow_dropped_total{reason="queue"})"),
            0);  // exists before the first drop
  ShadowComparison a;
  a.split_layer = 16;
  a.kl = 0.04;
  a.top1_agree = true;
  a.tokens = 10;
  a.ridgefill_nll = 12.5;
  a.exact_nll = 11.0;
  ShadowComparison b = a;
  b.kl = 0.5;
  b.top1_agree = false;
  b.tokens = 0;
  b.ridgefill_nll = b.exact_nll = 0;
  ShadowComparison c = a;
  c.split_layer = 20;
  c.kl = 0.002;
  metrics.RecordShadow(a);
  metrics.RecordShadow(b);
  metrics.RecordShadow(c);
  metrics.RecordShadowDropped("displaced");
  const std::string t = metrics.Render();
  EXPECT_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_samples_total{split_layer="16"})"), 2);
  EXPECT_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_top1_agreement_total{split_layer="16"})"), 1);
  EXPECT_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_samples_total{split_layer="20"})"), 1);
  EXPECT_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_kl_count{split_layer="16"})"), 2);
  EXPECT_DOUBLE_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_kl_sum{split_layer="16"})"), 0.54);
  EXPECT_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_kl_bucket{split_layer="16",le="0.05"})"), 1);
  EXPECT_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_generated_tokens_total{split_layer="16"})"),
            10);
  EXPECT_EQ(
      Value(
          t,
          R"(ridgeserve_ridgefill_shadow_generated_nll_total{prefill="ridgefill",split_layer="16"})"),
      12.5);
  EXPECT_EQ(
      Value(t,
            R"(ridgeserve_ridgefill_shadow_generated_nll_total{prefill="exact",split_layer="16"})"),
      11);
  EXPECT_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_dropped_total{reason="displaced"})"), 1);
  EXPECT_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_dropped_total{reason="queue"})"), 0);
}

// With sampling on, a split's series are scraped at 0 before its first comparison, so that
// rate() over them counts that comparison; splits of maps loaded later join them.
TEST(ServerMetricsTest, ShadowSeriesOfLoadedSplitsStartAtZero) {
  ServerMetrics metrics(Idle, Info());
  RidgeFillMapsSnapshot maps;
  maps.state = RidgeFillMapsState::kLoaded;
  maps.split_layers = {16, 20};
  metrics.SetRidgeFillMaps([&maps] { return maps; });
  const std::string samples16 = R"(ridgeserve_ridgefill_shadow_samples_total{split_layer="16"})";
  metrics.Render();
  EXPECT_EQ(Value(metrics.Render(), samples16), -1);  // sampling off: no series by split
  metrics.ExportShadowSeriesBySplit();
  std::string t = metrics.Render();  // the first scrape that sees the maps has the series
  for (const char* split : {"16", "20"}) {
    const std::string l = absl::StrCat(R"({split_layer=")", split, R"("})");
    EXPECT_EQ(Value(t, "ridgeserve_ridgefill_shadow_samples_total" + l), 0) << split;
    EXPECT_EQ(Value(t, "ridgeserve_ridgefill_shadow_top1_agreement_total" + l), 0) << split;
    EXPECT_EQ(Value(t, "ridgeserve_ridgefill_shadow_kl_count" + l), 0) << split;
    EXPECT_EQ(Value(t, "ridgeserve_ridgefill_shadow_generated_tokens_total" + l), 0) << split;
    for (const char* prefill : {"ridgefill", "exact"}) {
      EXPECT_EQ(
          Value(t, absl::StrCat(R"(ridgeserve_ridgefill_shadow_generated_nll_total{prefill=")",
                                prefill, R"(",split_layer=")", split, R"("})")),
          0)
          << split << " " << prefill;
    }
  }
  maps.split_layers = {18};  // a reload with other splits
  EXPECT_EQ(
      Value(metrics.Render(), R"(ridgeserve_ridgefill_shadow_samples_total{split_layer="18"})"), 0);
  ShadowComparison c;
  c.split_layer = 18;
  c.kl = 0.1;
  metrics.RecordShadow(c);
  t = metrics.Render();
  EXPECT_EQ(Value(t, R"(ridgeserve_ridgefill_shadow_samples_total{split_layer="18"})"), 1);
  EXPECT_EQ(Value(t, samples16), 0);
}

TEST(ServerMetricsTest, RidgeFillRequestCountsFilledRowsAndSavedSeconds) {
  ServerMetrics metrics(Idle, Info());
  RequestMetrics request(metrics, EngineRequest{});
  request.OnEvent(Token(/*split_layer=*/22), v1::FINISH_REASON_UNSPECIFIED);
  request.OnEvent(Token(22), v1::FINISH_REASON_UNSPECIFIED);
  request.OnEvent(Final(Token(22)), v1::STOP_SEQUENCE);
  const std::string text = metrics.Render();
  EXPECT_EQ(
      Value(text,
            R"(ridgeserve_requests_total{finish_reason="stop_sequence",prefill_mode="ridgefill"})"),
      1);
  EXPECT_EQ(
      Value(text, R"(ridgeserve_time_to_first_token_seconds_count{prefill_mode="ridgefill"})"), 1);
  EXPECT_EQ(Value(text, R"(ridgeserve_time_to_first_token_seconds_count{prefill_mode="exact"})"),
            0);
  EXPECT_EQ(Value(text, "ridgeserve_ridgefill_filled_tokens_total"), 40);
  EXPECT_EQ(Value(text, "ridgeserve_ridgefill_skipped_layer_tokens_total"), 280);
  EXPECT_EQ(Value(text, "ridgeserve_ridgefill_ttft_saved_seconds_count"), 1);
  EXPECT_EQ(Value(text, "ridgeserve_ridgefill_ttft_saved_seconds_sum"), 0.125);
}

// A SpecPC or SpecKV request of 50 prompt tokens with `budget`.
EngineRequest DraftRequest(int32_t budget, bool spec_kv) {
  EngineRequest r;
  r.prompt.assign(50, 7);
  (spec_kv ? r.spec_kv.budget : r.spec_pc.budget) = budget;
  return r;
}

// The token events a SpecPC run of 50 prompt tokens keeping `kept` of them gives.
TokenEvent SpecPcToken(int32_t kept) {
  TokenEvent e = Token();
  e.kept_prompt_tokens = kept;
  e.exact_prompt_tokens = kept;
  if (kept < e.prompt_tokens) e.timing.estimated_ttft_saved_seconds = 0.0625;
  return e;
}

// The same for SpecKV keeping `kept` KV entries per layer and head: the prompt is prefilled.
TokenEvent SpecKvToken(int32_t kept) {
  TokenEvent e = Token();
  e.kept_prompt_tokens = e.prompt_tokens;
  e.exact_prompt_tokens = e.prompt_tokens;
  e.kept_kv_tokens = kept;
  return e;
}

// Feeds two token events like `token`, then a final one with `draft_seconds`.
void RunTwoTokens(RequestMetrics& request, const TokenEvent& token, double draft_seconds,
                  v1::FinishReason reason) {
  request.OnEvent(token, v1::FINISH_REASON_UNSPECIFIED);
  request.OnEvent(token, v1::FINISH_REASON_UNSPECIFIED);
  TokenEvent last = Final(token);
  last.timing.draft_seconds = draft_seconds;
  request.OnEvent(last, reason);
}

// RunTwoTokens' one request is in prefill_mode `mode` of every per-mode series, not in "exact".
void ExpectCountedOnceIn(const std::string& text, const std::string& mode) {
  EXPECT_EQ(Value(text, absl::StrCat(R"(ridgeserve_requests_total{finish_reason="length",)",
                                     R"(prefill_mode=")", mode, R"("})")),
            1);
  EXPECT_EQ(
      Value(text, R"(ridgeserve_requests_total{finish_reason="length",prefill_mode="exact"})"), 0);
  for (const char* histogram :
       {"ridgeserve_time_to_first_token_seconds", "ridgeserve_e2e_request_latency_seconds",
        "ridgeserve_request_queue_time_seconds", "ridgeserve_request_prefill_time_seconds",
        "ridgeserve_inter_token_latency_seconds"}) {
    EXPECT_EQ(Value(text, absl::StrCat(histogram, R"(_count{prefill_mode=")", mode, R"("})")), 1)
        << histogram;
  }
  EXPECT_EQ(Value(text, "ridgeserve_prompt_tokens_total"), 50);
}

TEST(ServerMetricsTest, SpecPcRequestCountsDroppedTokensDraftAndSavedSeconds) {
  ServerMetrics metrics(Idle, Info());
  RequestMetrics request(metrics, DraftRequest(/*budget=*/20, /*spec_kv=*/false));
  RunTwoTokens(request, SpecPcToken(20), /*draft_seconds=*/0.375, v1::LENGTH);
  const std::string text = metrics.Render();
  ExpectCountedOnceIn(text, "spec_pc");
  EXPECT_EQ(Value(text, "ridgeserve_spec_pc_dropped_prompt_tokens_total"), 30);
  EXPECT_EQ(Value(text, "ridgeserve_spec_pc_draft_seconds_count"), 1);
  EXPECT_EQ(Value(text, "ridgeserve_spec_pc_draft_seconds_sum"), 0.375);
  EXPECT_EQ(Value(text, "ridgeserve_spec_pc_ttft_saved_seconds_count"), 1);
  EXPECT_EQ(Value(text, "ridgeserve_spec_pc_ttft_saved_seconds_sum"), 0.0625);
  EXPECT_EQ(Value(text, "ridgeserve_ridgefill_ttft_saved_seconds_count"), 0);
  EXPECT_EQ(Value(text, "ridgeserve_spec_kv_draft_seconds_count"), 0);
}

TEST(ServerMetricsTest, SpecKvRequestCountsKeptAndDroppedEntriesAndDraft) {
  ServerMetrics metrics(Idle, Info());
  RequestMetrics request(metrics, DraftRequest(/*budget=*/40, /*spec_kv=*/true));
  RunTwoTokens(request, SpecKvToken(40), /*draft_seconds=*/0.625, v1::LENGTH);
  const std::string text = metrics.Render();
  ExpectCountedOnceIn(text, "spec_kv");
  EXPECT_EQ(Value(text, "ridgeserve_spec_kv_kept_kv_tokens_total"), 40);
  EXPECT_EQ(Value(text, "ridgeserve_spec_kv_dropped_kv_tokens_total"), 10);
  EXPECT_EQ(Value(text, "ridgeserve_spec_kv_draft_seconds_count"), 1);
  EXPECT_EQ(Value(text, "ridgeserve_spec_kv_draft_seconds_sum"), 0.625);
  // Nothing in SpecPC's or RidgeFill's.
  EXPECT_EQ(Value(text, "ridgeserve_spec_pc_dropped_prompt_tokens_total"), 0);
  EXPECT_EQ(Value(text, "ridgeserve_spec_pc_draft_seconds_count"), 0);
  EXPECT_EQ(Value(text, "ridgeserve_spec_pc_ttft_saved_seconds_count"), 0);
  EXPECT_EQ(Value(text, "ridgeserve_ridgefill_ttft_saved_seconds_count"), 0);
}

TEST(ServerMetricsTest, DraftBudgetCoveringThePromptIsExact) {
  for (const bool spec_kv : {false, true}) {
    ServerMetrics metrics(Idle, Info());
    RequestMetrics request(metrics, DraftRequest(/*budget=*/50, spec_kv));
    RunTwoTokens(request, spec_kv ? SpecKvToken(50) : SpecPcToken(50), 0, v1::STOP);
    const std::string text = metrics.Render();
    EXPECT_EQ(
        Value(text, R"(ridgeserve_requests_total{finish_reason="stop",prefill_mode="exact"})"), 1);
    for (const char* mode : {"spec_pc", "spec_kv"}) {
      EXPECT_EQ(Value(text, absl::StrCat(R"(ridgeserve_requests_total{finish_reason="stop",)",
                                         R"(prefill_mode=")", mode, R"("})")),
                0);
    }
    for (const char* counter :
         {"ridgeserve_spec_pc_dropped_prompt_tokens_total",
          "ridgeserve_spec_pc_draft_seconds_count", "ridgeserve_spec_pc_ttft_saved_seconds_count",
          "ridgeserve_spec_kv_kept_kv_tokens_total", "ridgeserve_spec_kv_dropped_kv_tokens_total",
          "ridgeserve_spec_kv_draft_seconds_count"}) {
      EXPECT_EQ(Value(text, counter), 0) << counter << (spec_kv ? " (SpecKV)" : " (SpecPC)");
    }
  }
}

TEST(ServerMetricsTest, FailuresCountOnlyAsErrors) {
  ServerMetrics metrics(Idle, Info());
  metrics.RecordError(absl::StatusCode::kInvalidArgument);
  metrics.RecordError(absl::StatusCode::kInvalidArgument);
  metrics.RecordError(absl::StatusCode::kDeadlineExceeded);  // not pre-registered
  RequestMetrics failed(metrics, EngineRequest{});
  failed.OnEvent(Token(), v1::FINISH_REASON_UNSPECIFIED);
  failed.OnEvent(Final(Token(), absl::InternalError("boom")), v1::FINISH_REASON_UNSPECIFIED);
  RequestMetrics aborted_before_first_token(metrics, EngineRequest{});
  TokenEvent abort = Final(TokenEvent());
  abort.finish_reason = FinishReason::kAborted;
  aborted_before_first_token.OnEvent(abort, v1::ABORTED);

  const std::string text = metrics.Render();
  EXPECT_EQ(Value(text, R"(ridgeserve_request_errors_total{code="INVALID_ARGUMENT"})"), 2);
  EXPECT_EQ(Value(text, R"(ridgeserve_request_errors_total{code="DEADLINE_EXCEEDED"})"), 1);
  EXPECT_EQ(Value(text, R"(ridgeserve_request_errors_total{code="INTERNAL"})"), 1);
  EXPECT_EQ(Value(text, R"(ridgeserve_request_errors_total{code="OUT_OF_RANGE"})"), 0);
  EXPECT_EQ(
      Value(text, R"(ridgeserve_requests_total{finish_reason="length",prefill_mode="exact"})"), 0);
  EXPECT_EQ(
      Value(text, R"(ridgeserve_requests_total{finish_reason="aborted",prefill_mode="exact"})"), 1);
  // The failed request had its first token; the aborted one never did: no queue or prefill
  // time for it, but its E2E is observed.
  EXPECT_EQ(Value(text, R"(ridgeserve_time_to_first_token_seconds_count{prefill_mode="exact"})"),
            1);
  EXPECT_EQ(Value(text, R"(ridgeserve_request_queue_time_seconds_count{prefill_mode="exact"})"), 0);
  EXPECT_EQ(Value(text, R"(ridgeserve_e2e_request_latency_seconds_count{prefill_mode="exact"})"),
            1);
}

TEST(ServerMetricsTest, EngineStatsAndBuildInfoAtScrapeTime) {
  EngineStats stats = Idle();
  ServerMetrics metrics([&stats] { return stats; }, Info());
  EXPECT_EQ(Value(metrics.Render(), "ridgeserve_kv_cache_usage_ratio"), 0);
  stats.num_running = 3;
  stats.num_waiting = 2;
  stats.kv_blocks_free = 25;
  stats.num_preemptions = 7;
  stats.num_steps = 40;
  stats.step_rows = 1000;
  stats.step_seconds = 2.5;
  stats.forward_seconds = 2.0;
  const std::string text = metrics.Render();
  EXPECT_EQ(Value(text, "ridgeserve_num_requests_running"), 3);
  EXPECT_EQ(Value(text, "ridgeserve_num_requests_waiting"), 2);
  EXPECT_EQ(Value(text, "ridgeserve_kv_cache_usage_ratio"), 0.75);
  EXPECT_EQ(Value(text, "ridgeserve_num_preemptions_total"), 7);
  EXPECT_EQ(Value(text, "ridgeserve_engine_steps_total"), 40);
  EXPECT_EQ(Value(text, "ridgeserve_engine_step_rows_total"), 1000);
  EXPECT_EQ(Value(text, R"(ridgeserve_engine_step_seconds_total{part="forward"})"), 2.0);
  EXPECT_EQ(Value(text, R"(ridgeserve_engine_step_seconds_total{part="host"})"), 0.5);
  EXPECT_EQ(
      Value(
          text,
          R"(ridgeserve_build_info{backend="cpu",model="tiny",tensor_parallel="2",version="1.2.3"})"),
      1);
}

// GET /metrics over a plain socket; the response body.
std::string HttpGet(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

TEST(ServerMetricsTest, ServesOnAFreePortAndRefusesABusyOne) {
  ServerMetrics metrics(Idle, Info());
  metrics.RecordError(absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(metrics.Serve("127.0.0.1", 0).ok());
  ASSERT_GT(metrics.port(), 0);
  const std::string body = HttpGet(metrics.port());
  EXPECT_EQ(Value(body, R"(ridgeserve_request_errors_total{code="RESOURCE_EXHAUSTED"})"), 1);
  EXPECT_EQ(Value(body, "ridgeserve_num_requests_running"), 0);

  ServerMetrics second(Idle, Info());
  const absl::Status busy = second.Serve("127.0.0.1", metrics.port());
  EXPECT_EQ(busy.code(), absl::StatusCode::kUnavailable) << busy;
}

}  // namespace
}  // namespace ridgeserve
