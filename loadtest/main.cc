// ridgeserve-loadtest: drives a running ridgeserve with GenerateStream calls and measures what
// users feel (client-side, queue-inclusive TTFT, inter-token latency, TPOT, E2E), throughput,
// goodput under SLOs and errors by gRPC code, per prefill mode (exact, RidgeFill, SpecPC,
// SpecKV).
//   ridgeserve-loadtest --text FILE --arrival closed --concurrency 4 --num_requests 100
//   ridgeserve-loadtest --text FILE --arrival poisson --rate 2 --duration_s 60
//   ridgeserve-loadtest --text FILE --arrival gamma --rate 2 --burstiness 0.5
//   ridgeserve-loadtest --text FILE --arrival poisson --sweep_rates 1,2,4 --json r.json
//   ridgeserve-loadtest --text FILE --mode_share exact=0.5,ridgefill=0.25,spec_pc=0.25
//   ridgeserve-loadtest --text FILE --mode_share exact=0.5,spec_kv=0.5 --spec_kv_budget 256
// Exit code: 0 when the run completed (failed requests are results, not failures); otherwise
// the absl status code of the problem, printed as "CODE: message".
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/channel.h"
#include "client/channel_flags.h"
#include "engine/common/status_macros.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "loadtest/length_distribution.h"
#include "loadtest/plot.h"
#include "loadtest/progress_line.h"
#include "loadtest/report.h"
#include "loadtest/runner.h"
#include "loadtest/target.h"
#include "loadtest/workload.h"
#include "ridgeserve/v1/ridgeserve.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "server HOST:PORT (loopback unless --allow_remote)");
ABSL_FLAG(bool, allow_remote, false, "allow a --target that is not a loopback address");
// Arrivals.
ABSL_FLAG(std::string, arrival, "",
          "closed (fixed --concurrency), poisson (--rate) or gamma (--rate, --burstiness); "
          "empty: open loop when --rate or --sweep_rates is given (gamma when --burstiness is "
          "not 1), else closed");
ABSL_FLAG(int32_t, concurrency, 1, "closed loop: calls kept in flight (also the warm-up's)");
ABSL_FLAG(double, rate, 0, "open loop: mean arrival rate, requests per second");
ABSL_FLAG(double, burstiness, 1,
          "gamma: shape of the inter-arrival distribution (1 = Poisson, < 1 burstier); mean "
          "rate stays --rate");
ABSL_FLAG(std::string, sweep_rates, "",
          "open loop: comma-separated rates, one phase each (instead of --rate)");
ABSL_FLAG(int64_t, num_requests, 100, "requests per phase (at most)");
ABSL_FLAG(double, duration_s, 300, "per phase: no request is sent after this many seconds");
ABSL_FLAG(int64_t, warmup_requests, 1, "sent first (closed loop), left out of every statistic");
ABSL_FLAG(double, timeout_s, 300, "deadline of each request, seconds");
// Workload.
ABSL_FLAG(std::string, text, "", "real text to cut prompts from (required), e.g. a book");
ABSL_FLAG(int64_t, text_max_bytes, 8 << 20, "read at most this much of --text");
ABSL_FLAG(std::string, prompt_tokens, "fixed:512",
          "prompt length: N, fixed:N, uniform:A:B or list:a,b,c (exact; approximate with --chat)");
ABSL_FLAG(std::string, output_tokens, "fixed:64", "tokens to generate: same forms");
ABSL_FLAG(bool, chat, false,
          "send each prompt as a user chat message (the template adds tokens: lengths are "
          "approximate)");
ABSL_FLAG(std::string, mode_share, "",
          "prefill mix, MODE=SHARE,... with MODE exact, ridgefill, spec_pc or spec_kv and the "
          "shares summing to 1, e.g. exact=0.5,ridgefill=0.25,spec_pc=0.25 (empty: all exact, "
          "or --ridgefill_share)");
ABSL_FLAG(double, ridgefill_share, 0,
          "fraction of requests sent with prefill mode RIDGEFILL, the rest EXACT (shorthand for "
          "--mode_share exact=1-S,ridgefill=S)");
ABSL_FLAG(std::optional<int32_t>, exact_tail_tokens, std::nullopt,
          "RIDGEFILL requests: prompt tail run exactly (default: the server's)");
ABSL_FLAG(std::optional<int32_t>, split_layer, std::nullopt,
          "RIDGEFILL requests: split layer (default: the maps')");
ABSL_FLAG(std::optional<int32_t>, spec_pc_budget, std::nullopt,
          "SPEC_PC requests: prompt tokens kept (default: the server's --spec_pc_budget)");
ABSL_FLAG(std::optional<int32_t>, spec_kv_budget, std::nullopt,
          "SPEC_KV requests: prompt KV entries kept per layer and KV head (default: the server's "
          "--spec_kv_budget)");
ABSL_FLAG(double, temperature, 0, "sampling temperature (0 = greedy)");
ABSL_FLAG(bool, ignore_eos, true, "decode exactly --output_tokens tokens");
ABSL_FLAG(uint64_t, seed, 0, "seeds prompt offsets, lengths, the prefill mix and arrivals");
// Goodput and output.
ABSL_FLAG(double, slo_ttft_ms, 0, "goodput: TTFT limit in ms (0 = none)");
ABSL_FLAG(double, slo_tpot_ms, 0, "goodput: TPOT limit in ms (0 = none)");
ABSL_FLAG(std::string, json, "", "write the summary and every request's record as JSON");
ABSL_FLAG(std::string, csv, "", "write one CSV row per request");
ABSL_FLAG(std::string, plot, "", "draw a PNG with gnuplot (TTFT CDF; latency vs rate)");

namespace ridgeserve::loadtest {
namespace {

constexpr double kSetupTimeoutS = 30;

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

absl::StatusOr<std::vector<PhaseSpec>> BuildPhases() {
  std::string arrival = absl::GetFlag(FLAGS_arrival);
  if (arrival.empty()) {
    const bool open = absl::GetFlag(FLAGS_rate) != 0 || !absl::GetFlag(FLAGS_sweep_rates).empty();
    arrival = !open ? "closed" : absl::GetFlag(FLAGS_burstiness) != 1 ? "gamma" : "poisson";
  }
  PhaseSpec base;
  base.arrival = arrival;
  base.num_requests = absl::GetFlag(FLAGS_num_requests);
  base.duration_s = absl::GetFlag(FLAGS_duration_s);
  base.concurrency = absl::GetFlag(FLAGS_concurrency);
  base.burstiness = absl::GetFlag(FLAGS_burstiness);
  if (base.num_requests < 1) return absl::InvalidArgumentError("--num_requests must be >= 1");
  if (!(base.duration_s > 0)) return absl::InvalidArgumentError("--duration_s must be > 0");
  if (base.concurrency < 1) return absl::InvalidArgumentError("--concurrency must be >= 1");
  const std::string sweep = absl::GetFlag(FLAGS_sweep_rates);
  const double rate = absl::GetFlag(FLAGS_rate);
  if (arrival == "closed") {
    if (!sweep.empty() || rate != 0) {
      return absl::InvalidArgumentError("--rate and --sweep_rates need --arrival poisson or gamma");
    }
    return std::vector<PhaseSpec>{base};
  }
  if (arrival != "poisson" && arrival != "gamma") {
    return absl::InvalidArgumentError(
        absl::StrCat("--arrival: \"", arrival, "\" is not closed, poisson or gamma"));
  }
  if (arrival == "poisson" && base.burstiness != 1) {
    return absl::InvalidArgumentError("--burstiness needs --arrival gamma (poisson is B = 1)");
  }
  if (!(base.burstiness > 0)) return absl::InvalidArgumentError("--burstiness must be > 0");
  std::vector<double> rates;
  if (!sweep.empty()) {
    if (rate != 0) return absl::InvalidArgumentError("give --rate or --sweep_rates, not both");
    for (absl::string_view item : absl::StrSplit(sweep, ',')) {
      double r = 0;
      if (!absl::SimpleAtod(item, &r) || !(r > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--sweep_rates: \"", item, "\" is not a positive rate"));
      }
      rates.push_back(r);
    }
  } else {
    if (!(rate > 0)) return absl::InvalidArgumentError("open loop needs --rate > 0");
    rates.push_back(rate);
  }
  std::vector<PhaseSpec> phases;
  for (double r : rates) {
    PhaseSpec p = base;
    p.rate = r;
    if (arrival == "poisson") p.burstiness = 1;
    phases.push_back(p);
  }
  return phases;
}

nlohmann::json ConfigJson(const WorkloadOptions& w, const std::string& arrival) {
  nlohmann::json c = {{"target", absl::GetFlag(FLAGS_target)},
                      {"arrival", arrival},
                      {"concurrency", absl::GetFlag(FLAGS_concurrency)},
                      {"rate", absl::GetFlag(FLAGS_rate)},
                      {"burstiness", absl::GetFlag(FLAGS_burstiness)},
                      {"sweep_rates", absl::GetFlag(FLAGS_sweep_rates)},
                      {"num_requests", absl::GetFlag(FLAGS_num_requests)},
                      {"duration_s", absl::GetFlag(FLAGS_duration_s)},
                      {"warmup_requests", absl::GetFlag(FLAGS_warmup_requests)},
                      {"timeout_s", absl::GetFlag(FLAGS_timeout_s)},
                      {"text", absl::GetFlag(FLAGS_text)},
                      {"prompt_tokens", w.prompt_tokens.ToString()},
                      {"output_tokens", w.output_tokens.ToString()},
                      {"chat", w.chat},
                      {"mode_share", nlohmann::json::object()},
                      {"exact_tail_tokens", nullptr},
                      {"split_layer", nullptr},
                      {"spec_pc_budget", nullptr},
                      {"spec_kv_budget", nullptr},
                      {"temperature", w.temperature},
                      {"ignore_eos", w.ignore_eos},
                      {"seed", w.seed}};
  if (w.exact_tail_tokens) c["exact_tail_tokens"] = *w.exact_tail_tokens;
  if (w.split_layer) c["split_layer"] = *w.split_layer;
  if (w.spec_pc_budget) c["spec_pc_budget"] = *w.spec_pc_budget;
  if (w.spec_kv_budget) c["spec_kv_budget"] = *w.spec_kv_budget;
  for (PrefillKind kind : kPrefillKinds) {
    c["mode_share"][PrefillKindName(kind)] = w.mode_share[static_cast<int>(kind)];
  }
  return c;
}

absl::StatusOr<WorkloadOptions> BuildWorkload() {
  RS_ASSIGN_OR_RETURN(
      LengthDistribution prompt,
      LengthDistribution::Parse("prompt_tokens", absl::GetFlag(FLAGS_prompt_tokens), 1));
  RS_ASSIGN_OR_RETURN(
      LengthDistribution output,
      LengthDistribution::Parse("output_tokens", absl::GetFlag(FLAGS_output_tokens), 1));
  WorkloadOptions w{.prompt_tokens = std::move(prompt), .output_tokens = std::move(output)};
  w.chat = absl::GetFlag(FLAGS_chat);
  const double ridgefill_share = absl::GetFlag(FLAGS_ridgefill_share);
  if (!(ridgefill_share >= 0 && ridgefill_share <= 1)) {
    return absl::InvalidArgumentError("--ridgefill_share must be in [0, 1]");
  }
  if (const std::string mix = absl::GetFlag(FLAGS_mode_share); !mix.empty()) {
    if (ridgefill_share != 0) {
      return absl::InvalidArgumentError("give --mode_share or --ridgefill_share, not both");
    }
    RS_ASSIGN_OR_RETURN(w.mode_share, ParseModeShare(mix));
  } else {
    w.mode_share = {1 - ridgefill_share, ridgefill_share, 0, 0};
  }
  w.exact_tail_tokens = absl::GetFlag(FLAGS_exact_tail_tokens);
  w.split_layer = absl::GetFlag(FLAGS_split_layer);
  w.spec_pc_budget = absl::GetFlag(FLAGS_spec_pc_budget);
  w.spec_kv_budget = absl::GetFlag(FLAGS_spec_kv_budget);
  w.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  w.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  w.seed = absl::GetFlag(FLAGS_seed);
  w.request_id_prefix = absl::StrCat("lt-", getpid(), "-");
  return w;
}

// Polls the standard health service until the server says SERVING (it is NOT_SERVING while it
// loads and warms up, and while draining), for at most kSetupTimeoutS.
absl::Status WaitServing(const std::shared_ptr<grpc::Channel>& channel) {
  auto health = grpc::health::v1::Health::NewStub(channel);
  const auto end =
      std::chrono::steady_clock::now() + std::chrono::seconds(static_cast<int>(kSetupTimeoutS));
  std::string last = "no answer";
  while (std::chrono::steady_clock::now() < end) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    context.set_wait_for_ready(true);
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status s = health->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
    if (s.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    last = s.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status())
                  : absl::StrCat(
                        absl::StatusCodeToString(static_cast<absl::StatusCode>(s.error_code())),
                        ": ", s.error_message());
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return absl::UnavailableError(absl::StrCat(absl::GetFlag(FLAGS_target), " not SERVING after ",
                                             kSetupTimeoutS, " s (last: ", last, ")"));
}

absl::StatusOr<nlohmann::json> ModelJson(v1::Inference::Stub& stub, bool needs_ridgefill) {
  v1::ModelInfo info;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(static_cast<int>(kSetupTimeoutS)));
  context.set_wait_for_ready(true);
  if (grpc::Status s = stub.GetModelInfo(&context, v1::GetModelInfoRequest(), &info); !s.ok()) {
    return FromGrpc(s, absl::StrCat("GetModelInfo on ", absl::GetFlag(FLAGS_target)));
  }
  if (needs_ridgefill && info.ridgefill_split_layers().empty()) {
    return absl::FailedPreconditionError(
        "the mix has RIDGEFILL requests but the server has no RidgeFill maps (start it with "
        "--ridgefill_maps)");
  }
  return nlohmann::json{
      {"model_name", info.model_name()},
      {"architecture", info.architecture()},
      {"num_layers", info.num_layers()},
      {"context_length", info.context_length()},
      {"backend", info.backend()},
      {"ridgefill_split_layers", std::vector<int32_t>(info.ridgefill_split_layers().begin(),
                                                      info.ridgefill_split_layers().end())},
      {"default_exact_tail_tokens", info.default_exact_tail_tokens()}};
}

absl::Status Run() {
  RS_RETURN_IF_ERROR(CheckTarget(absl::GetFlag(FLAGS_target), absl::GetFlag(FLAGS_allow_remote)));
  RS_ASSIGN_OR_RETURN(std::vector<PhaseSpec> phases, BuildPhases());
  RS_ASSIGN_OR_RETURN(WorkloadOptions workload, BuildWorkload());
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  if (!(timeout_s > 0)) return absl::InvalidArgumentError("--timeout_s must be > 0");
  const int64_t warmup = absl::GetFlag(FLAGS_warmup_requests);
  if (warmup < 0) return absl::InvalidArgumentError("--warmup_requests must be >= 0");
  if (absl::GetFlag(FLAGS_text).empty()) {
    return absl::InvalidArgumentError(
        "--text FILE is required (real prose, e.g. /usr/share/common-licenses/GPL-3)");
  }

  RS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel,
                      OpenChannel(absl::GetFlag(FLAGS_target), ChannelSecurityFromFlags()));
  std::unique_ptr<v1::Inference::Stub> stub = v1::Inference::NewStub(channel);
  RunReport report;
  report.config = ConfigJson(workload, phases.front().arrival);
  report.slo.ttft_s = absl::GetFlag(FLAGS_slo_ttft_ms) / 1e3;
  report.slo.tpot_s = absl::GetFlag(FLAGS_slo_tpot_ms) / 1e3;
  RS_RETURN_IF_ERROR(WaitServing(channel));
  RS_ASSIGN_OR_RETURN(
      report.model,
      ModelJson(*stub, workload.mode_share[static_cast<int>(PrefillKind::kRidgeFill)] > 0));
  RS_ASSIGN_OR_RETURN(TokenCorpus corpus,
                      LoadTokenCorpus(*stub, absl::GetFlag(FLAGS_text),
                                      static_cast<size_t>(absl::GetFlag(FLAGS_text_max_bytes)),
                                      workload.chat, kSetupTimeoutS));
  std::fprintf(stderr, "%s: %zu tokens of prompt text from %s\n",
               absl::GetFlag(FLAGS_target).c_str(), corpus.ids.size(),
               absl::GetFlag(FLAGS_text).c_str());
  RS_ASSIGN_OR_RETURN(RequestFactory factory,
                      RequestFactory::Create(std::move(workload), std::move(corpus)));

  ProgressLine progress(isatty(STDERR_FILENO) != 0);
  Runner runner(*stub, factory, timeout_s, absl::GetFlag(FLAGS_seed), progress);
  if (warmup > 0) {
    PhaseSpec spec;
    spec.arrival = "closed";
    spec.concurrency = absl::GetFlag(FLAGS_concurrency);
    spec.num_requests = warmup;
    spec.duration_s = absl::GetFlag(FLAGS_duration_s);
    const PhaseResult w = runner.RunPhase(-1, "warm-up", spec);
    report.warmup_requests = static_cast<int64_t>(w.records.size());
    for (const RequestRecord& r : w.records) report.warmup_errors += r.ok() ? 0 : 1;
  }
  for (size_t i = 0; i < phases.size(); ++i) {
    const std::string label =
        absl::StrCat(PhaseLabel(phases[i]), " (", i + 1, "/", phases.size(), ")");
    report.phases.push_back(runner.RunPhase(static_cast<int32_t>(i), label, phases[i]));
  }

  PrintTable(report, stdout);
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    RS_RETURN_IF_ERROR(WriteJson(report, path));
  }
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) {
    RS_RETURN_IF_ERROR(WriteCsv(report, path));
  }
  if (const std::string path = absl::GetFlag(FLAGS_plot); !path.empty()) {
    if (absl::Status s = DrawPlot(report, path); !s.ok()) {
      std::fprintf(stderr, "plot: %s\n", std::string(s.message()).c_str());
    } else {
      std::fprintf(stderr, "plot: %s\n", path.c_str());
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace ridgeserve::loadtest

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "load generator for ridgeserve: TTFT, ITL, TPOT, E2E, throughput and goodput per prefill "
      "mode.\n  ridgeserve-loadtest --text FILE [--arrival closed --concurrency N | --arrival "
      "poisson --rate R | --arrival gamma --rate R --burstiness B | --sweep_rates r1,r2] ...");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() > 1) {
    std::fprintf(stderr, "INVALID_ARGUMENT: unexpected argument \"%s\"; see --help\n", args[1]);
    return static_cast<int>(absl::StatusCode::kInvalidArgument);
  }
  absl::Status status = ridgeserve::loadtest::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
                 std::string(status.message()).c_str());
    return static_cast<int>(status.code());
  }
  return 0;
}
