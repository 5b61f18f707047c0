// ridgeserve: the gRPC inference server. main() is lifecycle only: parse flags, load the
// model, start the endpoints, warm up, serve until SIGTERM/SIGINT, drain with a timeout, stop.
// SIGHUP reloads --ridgefill_maps (RidgeFillMapsManager), --auth_token_file and
// --admin_token_file.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/common/status_macros.h"
#include "engine/draft/draft_model.h"
#include "engine/draft/spec_kv.h"
#include "engine/draft/spec_pc.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/parallel/memory_plan.h"
#include "engine/parallel/rank_group.h"
#include "engine/ridgefill/online_calibration.h"
#include "engine/ridgefill/ridgefill_load.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/backend_registry.h"
#include "server/admin_service.h"
#include "server/bearer_token_auth.h"
#include "server/inference_service.h"
#include "server/metrics.h"
#include "server/ridgefill_maps_manager.h"
#include "server/ridgefill_shadow.h"
#include "server/server_credentials.h"
#include "server/server_options.h"
#include "server/shutdown_signal.h"
#include "server/warm_up.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, model, "models/SmolLM2-135M-Instruct.Q4_1.gguf",
          "GGUF file, or Hugging Face directory with config.json, *.safetensors and "
          "tokenizer.json");
ABSL_FLAG(std::string, ridgefill_maps, "",
          "RidgeFill map file from ridgeserve-calibrate (empty: RIDGEFILL requests are refused "
          "with FAILED_PRECONDITION). Not there yet: exact requests are served and the file is "
          "loaded when it appears (progress from FILE.progress); SIGHUP reloads it");
ABSL_FLAG(int32_t, default_split_layer, -1,
          "RidgeFill: split layer when a request names none (-1: the highest split in the maps, "
          "the most faithful)");
ABSL_FLAG(int32_t, ridgefill_sink_tokens, 4,
          "RidgeFill: first prompt tokens that always run exactly (attention sinks)");
ABSL_FLAG(int32_t, ridgefill_min_prompt_tokens, 0,
          "RidgeFill: prompts shorter than this run exactly");
ABSL_FLAG(double, ridgefill_max_leverage, 0,
          "RidgeFill: filled rows whose split-layer state has a leverage above this under the "
          "calibration Gram run exactly (0: off; see README)");
ABSL_FLAG(int32_t, ridgefill_shadow_step_tokens, 256,
          "rows of one engine step that shadows may take: a request arriving while a shadow "
          "runs waits for that step");
ABSL_FLAG(double, ridgefill_shadow_fraction, 0,
          "RidgeFill: fraction of RIDGEFILL requests whose exact prefill also runs, on idle "
          "capacity only, to measure what RidgeFill costs (ridgeserve_ridgefill_shadow_* "
          "metrics; 0: off)");
ABSL_FLAG(bool, ridgefill_online_calibration, false,
          "RidgeFill: learn the served text: exact requests' prompt rows feed calibration "
          "statistics, mixed with the shipped ones (--ridgefill_base_stats), re-solved every "
          "--ridgefill_online_resolve_rows rows and swapped in as a new map version; "
          "checkpointed in --ridgefill_online_dir (README, \"Online calibration\")");
ABSL_FLAG(std::string, ridgefill_base_stats, "",
          "RidgeFill online calibration: the calibration statistics of --ridgefill_maps "
          "(ridgeserve-calibrate --stats_out; empty: the maps' path with .rfstats for .rfmap)");
ABSL_FLAG(std::string, ridgefill_online_dir, "",
          "RidgeFill online calibration: directory of its checkpoint (stats.rfstats) and re-solved "
          "maps (maps.rfmap); empty: --ridgefill_maps's path + .online");
ABSL_FLAG(double, ridgefill_online_share, 0.5,
          "RidgeFill online calibration: share of the served rows in the mixed statistics "
          "(0: the shipped statistics only, 1: the served only)");
ABSL_FLAG(int64_t, ridgefill_online_resolve_rows, 8192,
          "RidgeFill online calibration: served rows between re-solves");
ABSL_FLAG(int32_t, ridgefill_online_row_stride, 4,
          "RidgeFill online calibration: every k-th prompt position of exact requests is taken");
ABSL_FLAG(std::string, host, "127.0.0.1", "address to listen on");
ABSL_FLAG(int32_t, port, 50051, "gRPC port (0: pick a free one; the log says which)");
ABSL_FLAG(int32_t, metrics_port, 9400,
          "Prometheus /metrics port (0: pick a free one, the log says which; -1: no metrics "
          "endpoint)");
ABSL_FLAG(std::string, metrics_host, "", "address /metrics listens on (empty: the same as --host)");
// Security: TLS, mutual TLS and bearer tokens on the gRPC port (not on /metrics).
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the gRPC port (with --tls_key: TLS; empty: plaintext)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert (not encrypted)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificates: clients must present a certificate they signed (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "bearer tokens, one a line: every call (but those of ridgeserve.v1.Admin) must send the "
          "metadata \"authorization: Bearer TOKEN\" with one of them, else UNAUTHENTICATED "
          "(empty: no token check). SIGHUP rereads it");
ABSL_FLAG(std::string, admin_token_file, "",
          "bearer tokens, one a line, of the ridgeserve.v1.Admin calls (ReloadRidgeFillMaps), "
          "which take no other token (empty: Admin answers PERMISSION_DENIED). SIGHUP rereads "
          "it");
ABSL_FLAG(bool, auth_exempt_health, true,
          "with --auth_token_file: grpc.health.v1.Health needs no token (Kubernetes probes)");
ABSL_FLAG(bool, auth_exempt_reflection, false,
          "with --auth_token_file: server reflection needs no token");
// Limits of a request and of a connection.
ABSL_FLAG(int32_t, max_prompt_tokens, 0,
          "prompts over this many tokens get OUT_OF_RANGE (0: only the model context limits)");
ABSL_FLAG(int32_t, max_stop_strings, ridgeserve::kMaxStopStrings,
          "stop strings a request may have (more: INVALID_ARGUMENT)");
ABSL_FLAG(int32_t, max_stop_string_bytes, ridgeserve::kMaxStopStringBytes,
          "bytes a stop string may have (longer: INVALID_ARGUMENT)");
ABSL_FLAG(int32_t, max_request_bytes, 4 << 20,
          "largest request message gRPC accepts (larger: RESOURCE_EXHAUSTED)");
ABSL_FLAG(int32_t, max_concurrent_streams, 100,
          "calls one client connection may have open at once (HTTP/2 "
          "SETTINGS_MAX_CONCURRENT_STREAMS; the client queues the others)");
ABSL_FLAG(std::string, backend, "cpu", "compute backend: cpu or cuda");
ABSL_FLAG(int32_t, tensor_parallel, 1, "GPUs to shard the model over");
ABSL_FLAG(int32_t, max_batch_tokens, 2048, "token budget of one engine step (prefill + decode)");
ABSL_FLAG(int32_t, max_running_requests, 64, "requests decoding or prefilling at once");
ABSL_FLAG(int32_t, max_queued_requests, 256,
          "waiting requests beyond this are refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, kv_cache_tokens, 0,
          "KV cache capacity in tokens (0: 65536 on the CPU, on a GPU what "
          "--gpu_memory_utilization leaves; there, a value > 0 is an upper bound)");
ABSL_FLAG(double, gpu_memory_utilization, 0.90,
          "share of each GPU's memory the server may use (weights, workspace, RidgeFill maps, KV "
          "cache), less what other processes hold");
ABSL_FLAG(bool, enforce_eager, false,
          "run every step as it comes: no recorded decode graphs on a GPU backend (they replay "
          "decode steps padded to a bucket of rows; off at tensor parallel > 1 and on the CPU)");
ABSL_FLAG(bool, enable_prefix_caching, true,
          "reuse the KV blocks of prompt prefixes computed before (per prefill mode)");
ABSL_FLAG(int32_t, default_exact_tail_tokens, 1024,
          "RidgeFill: exact prompt tail when a request does not say");
ABSL_FLAG(int32_t, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(int32_t, event_threads, 1,
          "threads that turn engine events into responses (detokenizing, stop strings, "
          "protobufs, metrics), off the engine thread; a call's events stay on one");
ABSL_FLAG(std::string, cpu_activations, "f32",
          "CPU backend: f32 (float math on the exact dequantized weights) or int8 (activations "
          "quantized per 32-block, integer dot products: about 1.9x the decode speed, less exact)");
ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "KV cache element type: f32, bf16, f16 (rounded to nearest even when stored, widened "
          "exactly when read) or auto (the backend's default: f16 on the CPU)");
ABSL_FLAG(std::string, draft_model, "",
          "SpecPC / SpecKV draft model: self:K (the model's own first K layers, sharing its "
          "weights) or a GGUF file / Hugging Face directory with the model's vocabulary (empty: "
          "SPEC_PC and SPEC_KV requests are refused with FAILED_PRECONDITION)");
ABSL_FLAG(int32_t, spec_pc_budget, 2048,
          "SpecPC: prompt tokens kept when a request names no budget (>= 64)");
ABSL_FLAG(int32_t, spec_pc_lookahead_tokens, 1,
          "SpecPC: tokens the draft decodes before scoring when a request does not say ([1, 64])");
ABSL_FLAG(int32_t, spec_kv_budget, 1024,
          "SpecKV: prompt KV entries kept per layer and KV head when a request names no budget "
          "(>= 33)");
ABSL_FLAG(int32_t, spec_kv_lookahead_tokens, 64,
          "SpecKV: the cap on the draft's lookahead answer (min(this, max_new_tokens) tokens) when "
          "a request does not say ([1, 64])");
ABSL_FLAG(int32_t, draft_kv_cache_tokens, 32768,
          "SpecPC / SpecKV: the draft's own KV cache in tokens");
ABSL_FLAG(bool, spec_pc_original_positions, false,
          "SpecPC: kept tokens keep their original RoPE positions instead of being renumbered "
          "0..budget-1 as the reference does");
ABSL_FLAG(double, step_timeout_s, 600,
          "an engine step running longer than this stalls the server: health NOT_SERVING (so "
          "that its probes restart it), a tensor-parallel group's collectives aborted, the "
          "step's requests and later ones UNAVAILABLE; 0: no limit");
ABSL_FLAG(double, shutdown_timeout_s, 30,
          "on SIGTERM/SIGINT, how long in-flight requests may take to finish before they are "
          "aborted");

namespace ridgeserve {
namespace {

constexpr absl::Duration kWarmUpTimeout = absl::Minutes(10);
// After the drain timeout: time for aborted streams to send their last message, then for
// gRPC to cancel whatever is left.
constexpr absl::Duration kAbortGrace = absl::Seconds(3);
constexpr absl::Duration kShutdownGrace = absl::Seconds(1);
constexpr int kMaxResponseBytes = 64 << 20;  // long completions with logprobs

absl::Status CheckFlags() {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "cpu" && backend != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--backend must be cpu or cuda, got ", backend));
  }
  if (absl::GetFlag(FLAGS_tensor_parallel) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor_parallel must be >= 1, got ", absl::GetFlag(FLAGS_tensor_parallel)));
  }
  const int32_t port = absl::GetFlag(FLAGS_port);
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port must be in [0, 65535], got ", port));
  }
  const int32_t metrics_port = absl::GetFlag(FLAGS_metrics_port);
  if (metrics_port < -1 || metrics_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port must be in [-1, 65535], got ", metrics_port));
  }
  for (const auto& [name, value] :
       {std::pair{"max_batch_tokens", absl::GetFlag(FLAGS_max_batch_tokens)},
        std::pair{"max_running_requests", absl::GetFlag(FLAGS_max_running_requests)},
        std::pair{"max_queued_requests", absl::GetFlag(FLAGS_max_queued_requests)},
        std::pair{"ridgefill_shadow_step_tokens",
                  absl::GetFlag(FLAGS_ridgefill_shadow_step_tokens)},
        std::pair{"draft_kv_cache_tokens", absl::GetFlag(FLAGS_draft_kv_cache_tokens)}}) {
    if (value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= 1, got ", value));
    }
  }
  if (absl::GetFlag(FLAGS_default_exact_tail_tokens) < 0) {
    return absl::InvalidArgumentError("--default_exact_tail_tokens must be >= 0");
  }
  const double shadow = absl::GetFlag(FLAGS_ridgefill_shadow_fraction);
  if (!(shadow >= 0 && shadow <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ridgefill_shadow_fraction must be in [0, 1], got ", shadow));
  }
  const double share = absl::GetFlag(FLAGS_ridgefill_online_share);
  if (!(share >= 0 && share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ridgefill_online_share must be in [0, 1], got ", share));
  }
  if (absl::GetFlag(FLAGS_ridgefill_online_resolve_rows) < 1 ||
      absl::GetFlag(FLAGS_ridgefill_online_row_stride) < 1) {
    return absl::InvalidArgumentError(
        "--ridgefill_online_resolve_rows and --ridgefill_online_row_stride must be >= 1");
  }
  // Before the model loads (Engine::Create checks it too).
  if (absl::Status s = CheckStepTimeout(absl::GetFlag(FLAGS_step_timeout_s)); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--step_timeout_s ", s.message()));
  }
  if (!(absl::GetFlag(FLAGS_shutdown_timeout_s) >= 0)) {
    return absl::InvalidArgumentError("--shutdown_timeout_s must be >= 0");
  }
  return absl::OkStatus();
}

// The SpecPC and SpecKV flags; an error is a usage error (exit code 2).
absl::Status CheckDraftFlags() {
  for (const auto& [mode, budget, min_budget, lookahead] :
       {std::tuple{"spec_pc", absl::GetFlag(FLAGS_spec_pc_budget), kSpecPcMinBudget,
                   absl::GetFlag(FLAGS_spec_pc_lookahead_tokens)},
        std::tuple{"spec_kv", absl::GetFlag(FLAGS_spec_kv_budget), kSpecKvMinBudget,
                   absl::GetFlag(FLAGS_spec_kv_lookahead_tokens)}}) {
    if (budget < min_budget) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", mode, "_budget must be >= ", min_budget, ", got ", budget));
    }
    if (lookahead < 1 || lookahead > kSpecPcMaxLookahead) {
      return absl::InvalidArgumentError(absl::StrCat("--", mode,
                                                     "_lookahead_tokens must be in [1, ",
                                                     kSpecPcMaxLookahead, "], got ", lookahead));
    }
  }
  if (!absl::GetFlag(FLAGS_draft_model).empty() && absl::GetFlag(FLAGS_tensor_parallel) > 1) {
    return absl::InvalidArgumentError(
        "--draft_model is not supported with --tensor_parallel > 1 yet");
  }
  return absl::OkStatus();
}

// The limit and capacity flags; an error is a usage error (exit code 2).
absl::Status CheckLimitFlags() {
  if (const double u = absl::GetFlag(FLAGS_gpu_memory_utilization); !(u > 0 && u <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_memory_utilization must be in (0, 1], got ", u));
  }
  for (const auto& [name, value, least] :
       {std::tuple{"kv_cache_tokens", absl::GetFlag(FLAGS_kv_cache_tokens), 0},
        std::tuple{"event_threads", absl::GetFlag(FLAGS_event_threads), 1},
        std::tuple{"max_prompt_tokens", absl::GetFlag(FLAGS_max_prompt_tokens), 0},
        std::tuple{"max_stop_strings", absl::GetFlag(FLAGS_max_stop_strings), 0},
        std::tuple{"max_stop_string_bytes", absl::GetFlag(FLAGS_max_stop_string_bytes), 1},
        std::tuple{"max_request_bytes", absl::GetFlag(FLAGS_max_request_bytes), 1},
        std::tuple{"max_concurrent_streams", absl::GetFlag(FLAGS_max_concurrent_streams), 1}}) {
    if (value < least) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " must be >= ", least, ", got ", value));
    }
  }
  return absl::OkStatus();
}

// The gRPC port's credentials and token check, from the security flags; read before the model
// loads, and an error is a usage error (exit code 2).
struct PortSecurity {
  std::shared_ptr<BearerTokenAuth> auth;   // null without --auth_token_file
  std::shared_ptr<BearerTokenAuth> admin;  // null without --admin_token_file
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::string description;  // for the log
};

absl::StatusOr<PortSecurity> PortSecurityFromFlags() {
  PortSecurity security;
  const TlsFiles tls{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
                     absl::GetFlag(FLAGS_tls_client_ca)};
  security.description = tls.tls_cert.empty()        ? "plaintext"
                         : tls.tls_client_ca.empty() ? "TLS"
                                                     : "mutual TLS";
  if (const std::string file = absl::GetFlag(FLAGS_auth_token_file); !file.empty()) {
    std::vector<std::string> exempt;
    if (absl::GetFlag(FLAGS_auth_exempt_health)) exempt.push_back("grpc.health.v1.Health");
    if (absl::GetFlag(FLAGS_auth_exempt_reflection)) {
      exempt.push_back("grpc.reflection.v1alpha.ServerReflection");
    }
    absl::StatusOr<std::unique_ptr<BearerTokenAuth>> auth = BearerTokenAuth::Create(file, exempt);
    if (!auth.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth_token_file ", auth.status().message()));
    }
    security.auth = std::move(*auth);
    absl::StrAppend(&security.description, ", bearer tokens (", security.auth->num_tokens(),
                    " from ", file, exempt.empty() ? "" : "; exempt: ", absl::StrJoin(exempt, ", "),
                    ")");
  }
  if (const std::string file = absl::GetFlag(FLAGS_admin_token_file); !file.empty()) {
    absl::StatusOr<std::unique_ptr<BearerTokenAuth>> admin = BearerTokenAuth::Create(file, {});
    if (!admin.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--admin_token_file ", admin.status().message()));
    }
    security.admin = std::move(*admin);
    absl::StrAppend(&security.description, ", admin tokens (", security.admin->num_tokens(),
                    " from ", file, ")");
  }
  RS_ASSIGN_OR_RETURN(security.credentials,
                      CreateServerCredentials(tls, {security.auth, security.admin}));
  return security;
}

// SIGHUP: a token file that does not read or holds no token leaves the tokens in use. Runs in
// the reload handler on the signal thread: a token file is a few lines, read there. `kind`:
// "auth" or "admin".
void ReloadTokens(BearerTokenAuth* auth, const char* kind) {
  if (auth == nullptr) return;
  if (absl::Status status = auth->Reload(); !status.ok()) {
    spdlog::warn("{} tokens reload refused, keeping {} token(s): {}", kind, auth->num_tokens(),
                 std::string(status.message()));
    return;
  }
  spdlog::info("{} tokens reloaded: {} token(s) from {}", kind, auth->num_tokens(),
               auth->token_file());
}

std::string ListenAddress(const std::string& host, int32_t port) {
  const bool ipv6 = absl::StrContains(host, ':') && !absl::StartsWith(host, "[");
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// Starts /metrics unless --metrics_port is -1.
absl::Status ServeMetrics(ServerMetrics& metrics) {
  const int32_t port = absl::GetFlag(FLAGS_metrics_port);
  if (port < 0) return absl::OkStatus();
  std::string host = absl::GetFlag(FLAGS_metrics_host);
  if (host.empty()) host = absl::GetFlag(FLAGS_host);
  RS_RETURN_IF_ERROR(metrics.Serve(host, port));
  spdlog::info("metrics on http://{}/metrics", ListenAddress(host, metrics.port()));
  return absl::OkStatus();
}

// Stop admitting, let in-flight requests finish until the timeout (or a second signal), then
// abort the rest; their streams end with finish_reason ABORTED.
void Drain(InferenceService& service, grpc::Server& server, const ShutdownSignal& signals) {
  server.GetHealthCheckService()->SetServingStatus(false);
  service.StartDraining();
  const absl::Duration timeout = absl::Seconds(absl::GetFlag(FLAGS_shutdown_timeout_s));
  spdlog::info("draining: {} request(s) in flight, waiting up to {}", service.num_in_flight(),
               absl::FormatDuration(timeout));
  const absl::Time deadline = absl::Now() + timeout;
  bool idle = false;
  // Short waits, so a second signal is noticed.
  while (!(idle = service.WaitForIdle(std::min(deadline, absl::Now() + absl::Milliseconds(100))))) {
    if (absl::Now() >= deadline) break;
    if (signals.count() > 1) {
      spdlog::warn("second signal: aborting in-flight requests now");
      break;
    }
  }
  if (!idle) {
    const int aborted = service.AbortAll();
    spdlog::warn("drain: aborted {} request(s) still in flight", aborted);
    if (!service.WaitForIdle(absl::Now() + kAbortGrace)) {
      spdlog::warn("drain: {} call(s) still open; cancelling them", service.num_in_flight());
    }
  }
  server.Shutdown(absl::ToChronoTime(absl::Now() + kShutdownGrace));
  server.Wait();
}

// The memory plan of a server on a device (--gpu_memory_utilization): the least KV cache it
// accepts is one full context, or --kv_cache_tokens when that is smaller.
MemoryPlanRequest DevicePlanRequest(const ModelConfig& config, int ranks, DType kv_dtype) {
  MemoryPlanRequest request;
  request.tensor_parallel = ranks;
  request.memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  request.kv_dtype = kv_dtype;
  request.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  request.max_running_requests = absl::GetFlag(FLAGS_max_running_requests);
  const int32_t cap = absl::GetFlag(FLAGS_kv_cache_tokens);
  request.min_kv_tokens = cap > 0 ? std::min(cap, config.context_length) : 0;
  return request;
}

// On a device, before the model loads: a model that does not fit on a rank's device stops the
// server with one line naming the bytes needed and free (exit 2). What it cannot plan (a file
// it cannot read, a tensor-parallel size the shape does not divide) is left to the loader,
// which names it.
void CheckModelFits(const std::string& model_path, const RankGroup& ranks, DType kv_dtype) {
  if (!ranks.backends.front()->MemoryInfo()) return;
  const absl::StatusOr<ModelConfig> config = ReadModelConfig(model_path);
  if (!config.ok()) return;
  const MemoryPlanRequest request = DevicePlanRequest(*config, ranks.size(), kv_dtype);
  for (int r = 0; r < ranks.size(); ++r) {
    const absl::Status fits = CheckDeviceFit(*config, request, *ranks.backends[r]->MemoryInfo());
    if (absl::IsResourceExhausted(fits)) {
      spdlog::error("the model does not fit on GPU {}: {}", r, std::string(fits.message()));
      std::exit(2);
    }
  }
}

// The KV cache's capacity in tokens: --kv_cache_tokens on the CPU (0: 65536). On a device,
// after the weights (and a draft's) are loaded: what --gpu_memory_utilization leaves of each
// rank's memory after what is in use, the workspace, the reserve, the RidgeFill maps (their
// f32 file's size: room for the bf16 maps twice, as a reload holds old and new) and the draft's
// cache and workspace, the fewest over the ranks, capped at --kv_cache_tokens when set. Too
// little: one line, exit 2.
int32_t KvCacheTokens(const Model& model, const RankGroup& ranks, DType kv_dtype,
                      const DraftModel* draft) {
  constexpr int32_t kCpuDefault = 65536;
  const int32_t cap = absl::GetFlag(FLAGS_kv_cache_tokens);
  if (!ranks.backends.front()->MemoryInfo()) return cap > 0 ? cap : kCpuDefault;
  std::error_code ec;
  const uintmax_t maps_bytes = std::filesystem::file_size(absl::GetFlag(FLAGS_ridgefill_maps), ec);
  double other = ec ? 0.0 : static_cast<double>(maps_bytes);
  const MemoryPlanRequest request = DevicePlanRequest(model.config, ranks.size(), kv_dtype);
  if (draft != nullptr) {
    const absl::StatusOr<double> draft_bytes = PlanDraftBytes(
        model.config, draft->config(), draft->num_layers,
        absl::GetFlag(FLAGS_draft_kv_cache_tokens), draft->owned != nullptr, request);
    if (!draft_bytes.ok()) {
      spdlog::error("--draft_model {}: {}", draft->name,
                    std::string(draft_bytes.status().message()));
      std::exit(2);
    }
    other += *draft_bytes;
  }
  int64_t tokens = std::numeric_limits<int32_t>::max();
  for (int r = 0; r < ranks.size(); ++r) {
    const DeviceMemory memory = *ranks.backends[r]->MemoryInfo();
    const absl::StatusOr<int64_t> rank = DeviceKvTokens(model.config, request, memory, other, cap);
    if (!rank.ok()) {
      spdlog::error("KV cache on GPU {}: {}", r, std::string(rank.status().message()));
      std::exit(2);
    }
    spdlog::info("GPU {}: {:.2f} of {:.2f} GB free after loading, room for {} KV tokens", r,
                 memory.free_bytes / 1e9, memory.total_bytes / 1e9, *rank);
    tokens = std::min(tokens, *rank);
  }
  return static_cast<int32_t>(tokens);
}

// --ridgefill_online_calibration: the calibrator over the shipped maps (which must be there
// at start) and their statistics; null when off.
absl::StatusOr<std::unique_ptr<OnlineCalibrator>> OnlineCalibratorFromFlags(Model& model) {
  if (!absl::GetFlag(FLAGS_ridgefill_online_calibration)) return nullptr;
  const std::string maps_path = absl::GetFlag(FLAGS_ridgefill_maps);
  if (maps_path.empty()) {
    return absl::InvalidArgumentError("--ridgefill_online_calibration needs --ridgefill_maps");
  }
  if (model.tensor_parallel() > 1) {
    return absl::InvalidArgumentError(
        "--ridgefill_online_calibration is not supported at --tensor_parallel > 1");
  }
  if (!std::filesystem::exists(maps_path)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--ridgefill_online_calibration needs the maps ", maps_path,
                     " and their statistics at start (make maps writes both)"));
  }
  RS_ASSIGN_OR_RETURN(std::unique_ptr<MapFile> shipped, OpenRidgeFillMapFile(maps_path, model));
  std::string base = absl::GetFlag(FLAGS_ridgefill_base_stats);
  if (base.empty()) base = std::filesystem::path(maps_path).replace_extension(".rfstats");
  std::string dir = absl::GetFlag(FLAGS_ridgefill_online_dir);
  if (dir.empty()) dir = maps_path + ".online";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--ridgefill_online_dir ", dir, ": ", ec.message()));
  }
  OnlineCalibrationOptions options;
  options.checkpoint_path = dir + "/stats.rfstats";
  options.maps_path = dir + "/maps.rfmap";
  options.served_share = absl::GetFlag(FLAGS_ridgefill_online_share);
  options.resolve_rows = absl::GetFlag(FLAGS_ridgefill_online_resolve_rows);
  options.row_stride = absl::GetFlag(FLAGS_ridgefill_online_row_stride);
  options.sink_tokens = absl::GetFlag(FLAGS_ridgefill_sink_tokens);
  RS_ASSIGN_OR_RETURN(std::unique_ptr<OnlineCalibrator> calibrator,
                      OnlineCalibrator::Create(*model.llama, shipped->maps().model, shipped->maps(),
                                               base, options));
  spdlog::info(
      "RidgeFill online calibration: every {}th prompt row of exact requests, re-solved every {} "
      "rows with served share {} over {}; checkpoint and maps in {}",
      options.row_stride, options.resolve_rows, options.served_share, base, dir);
  return calibrator;
}

absl::Status Serve(ShutdownSignal& signals, const PortSecurity& security) {
  RS_RETURN_IF_ERROR(CheckFlags());

  RS_ASSIGN_OR_RETURN(const cpu::Isa isa, cpu::IsaFromEnvironment());
  RS_ASSIGN_OR_RETURN(const cpu::Activations activations,
                      cpu::ParseActivations(absl::GetFlag(FLAGS_cpu_activations)));
  if (absl::GetFlag(FLAGS_backend) == "cpu") {
    spdlog::info("cpu kernels: {} path (from CPUID; RIDGESERVE_CPU_ISA overrides), {} activations",
                 cpu::IsaName(isa), cpu::ActivationsName(activations));
  }
  const int32_t tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  absl::StatusOr<RankGroup> created = CreateRankGroup(
      absl::GetFlag(FLAGS_backend), tensor_parallel,
      {.num_threads = absl::GetFlag(FLAGS_threads), .isa = isa, .activations = activations});
  if (!created.ok()) {
    // A backend this binary or machine lacks ("no CUDA device visible"): one line, exit 2.
    spdlog::error("--backend {}: {}", absl::GetFlag(FLAGS_backend),
                  std::string(created.status().message()));
    std::exit(2);
  }
  const RankGroup ranks = *std::move(created);
  Backend& backend = *ranks.backends.front();
  const std::string model_path = absl::GetFlag(FLAGS_model);
  RS_ASSIGN_OR_RETURN(const DType kv_dtype,
                      ResolveKvCacheDType(absl::GetFlag(FLAGS_kv_cache_dtype), backend));
  CheckModelFits(model_path, ranks, kv_dtype);
  const absl::Time load_start = absl::Now();
  absl::StatusOr<std::unique_ptr<Model>> loaded =
      LoadModel(model_path, ranks.backend_ptrs(), ranks.comms);
  if (!loaded.ok() && tensor_parallel > 1 &&
      (absl::StrContains(loaded.status().message(), "tensor parallel ") ||
       absl::StrContains(loaded.status().message(), "tensor-parallel slice"))) {
    // A size the model's heads or widths do not divide: one line naming the numbers, exit 2.
    spdlog::error("--tensor_parallel {}: {}", tensor_parallel,
                  std::string(loaded.status().message()));
    std::exit(2);
  }
  RS_RETURN_IF_ERROR(loaded.status());
  std::unique_ptr<Model> model = *std::move(loaded);
  for (LlamaModel* rank : model->rank_models()) rank->SetKvCacheDType(kv_dtype);
  spdlog::info("loaded {} ({}, {} layers, context {}) in {:.2f} s", model_path,
               model->config.arch_name, model->config.num_layers, model->config.context_length,
               absl::ToDoubleSeconds(absl::Now() - load_start));
  std::unique_ptr<DraftModel> draft;
  if (const std::string spec = absl::GetFlag(FLAGS_draft_model); !spec.empty()) {
    const absl::Time draft_start = absl::Now();
    absl::StatusOr<std::unique_ptr<DraftModel>> loaded_draft =
        LoadDraftModel(spec, *model, backend);
    if (!loaded_draft.ok()) {
      // A spec out of range or a draft whose vocabulary differs: one line, exit 2.
      spdlog::error("--draft_model: {}", std::string(loaded_draft.status().message()));
      std::exit(2);
    }
    draft = *std::move(loaded_draft);
    // self:K runs the target's own LlamaModel, configured above.
    if (draft->owned != nullptr) draft->owned->llama->SetKvCacheDType(kv_dtype);
    spdlog::info("draft model {} ({} of its {} layers, {}) in {:.2f} s", draft->name,
                 draft->num_layers, draft->config().num_layers,
                 draft->owned == nullptr ? "the target's weights" : "its own weights",
                 absl::ToDoubleSeconds(absl::Now() - draft_start));
  }

  // Before the engine, which hands it rows; stopped before the maps manager goes (below).
  RS_ASSIGN_OR_RETURN(std::unique_ptr<OnlineCalibrator> online, OnlineCalibratorFromFlags(*model));

  EngineOptions engine_options;
  if (online != nullptr) {
    engine_options.calibration_rows = {
        online->depths(), online->first_position(), online->row_stride(),
        [c = online.get()](std::span<const std::vector<float>> states,
                           std::span<const int32_t> rows) { c->Take(states, rows); }};
  }
  engine_options.ridgefill_sink_tokens = absl::GetFlag(FLAGS_ridgefill_sink_tokens);
  engine_options.ridgefill_min_prompt_tokens = absl::GetFlag(FLAGS_ridgefill_min_prompt_tokens);
  engine_options.scheduler.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  engine_options.scheduler.max_background_step_tokens =
      absl::GetFlag(FLAGS_ridgefill_shadow_step_tokens);
  engine_options.scheduler.max_running_requests = absl::GetFlag(FLAGS_max_running_requests);
  engine_options.decode_graphs = !absl::GetFlag(FLAGS_enforce_eager);
  engine_options.step_timeout_seconds = absl::GetFlag(FLAGS_step_timeout_s);
  engine_options.scheduler.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  engine_options.kv_cache_tokens = KvCacheTokens(*model, ranks, kv_dtype, draft.get());
  engine_options.scheduler.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  engine_options.draft = draft.get();
  engine_options.draft_kv_cache_tokens = absl::GetFlag(FLAGS_draft_kv_cache_tokens);
  engine_options.spec_pc_original_positions = absl::GetFlag(FLAGS_spec_pc_original_positions);
  // An engine that can run no more steps (a step past --step_timeout_s, a tensor-parallel group
  // NCCL cannot reset) turns the health service NOT_SERVING, so that Kubernetes' probes restart
  // the server.
  std::mutex health_mu;
  grpc::HealthCheckServiceInterface* health_service = nullptr;  // once the server exists
  bool engine_broken = false;
  engine_options.on_broken = [&](const absl::Status& reason) {
    spdlog::error("the engine can run no more steps ({}): health NOT_SERVING",
                  std::string(reason.message()));
    std::lock_guard lock(health_mu);
    engine_broken = true;
    if (health_service != nullptr) health_service->SetServingStatus(false);
  };
  RS_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(*model, engine_options));
  {
    const EngineStats stats = engine->stats();
    const KvCacheShape kv{model->config.num_layers, model->llama->shard().num_kv_heads,
                          model->config.head_dim,   stats.kv_block_size,
                          stats.kv_blocks_total,    kv_dtype};
    spdlog::info("KV cache: {} tokens of {} ({} bytes a token{}, {:.1f} MiB)",
                 int64_t{stats.kv_blocks_total} * stats.kv_block_size, KvCacheDTypeName(kv_dtype),
                 kv.BytesPerToken(), tensor_parallel > 1 ? " per rank" : "",
                 static_cast<double>(kv.BytesPerToken()) * stats.kv_blocks_total *
                     stats.kv_block_size / (1 << 20));
  }

  // RidgeFill maps: loaded now if the file is there (a bad one stops the server here), else
  // loaded when it appears; SIGHUP reloads them.
  RidgeFillMapsManager::Options maps_options;
  maps_options.path = absl::GetFlag(FLAGS_ridgefill_maps);
  maps_options.default_split_layer = absl::GetFlag(FLAGS_default_split_layer);
  maps_options.max_leverage = static_cast<float>(absl::GetFlag(FLAGS_ridgefill_max_leverage));
  RS_ASSIGN_OR_RETURN(std::unique_ptr<RidgeFillMapsManager> maps,
                      RidgeFillMapsManager::Create(*model, *engine, maps_options));
  signals.SetReloadHandler([&maps = *maps, auth = security.auth, admin = security.admin] {
    maps.RequestReload();
    ReloadTokens(auth.get(), "auth");
    ReloadTokens(admin.get(), "admin");
  });
  // Before `maps` goes: no SIGHUP may reach it afterwards.
  struct ClearReloadHandler {
    ShutdownSignal& signals;
    ~ClearReloadHandler() { signals.SetReloadHandler(nullptr); }
  } clear_reload_handler{signals};
  if (online != nullptr) {
    online->Start([&maps = *maps](const std::string& path) { return maps.LoadFile(path); });
  }
  // Before `maps` goes: no re-solve may swap maps in afterwards.
  struct StopOnline {
    OnlineCalibrator* calibrator;
    ~StopOnline() {
      if (calibrator != nullptr) calibrator->Stop();
    }
  } stop_online{online.get()};

  ServerOptions options;
  options.backend = absl::GetFlag(FLAGS_backend);
  options.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  options.event_threads = absl::GetFlag(FLAGS_event_threads);
  options.default_exact_tail_tokens = absl::GetFlag(FLAGS_default_exact_tail_tokens);
  options.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  options.max_stop_strings = absl::GetFlag(FLAGS_max_stop_strings);
  options.max_stop_string_bytes = absl::GetFlag(FLAGS_max_stop_string_bytes);
  options.has_draft_model = draft != nullptr;
  options.spec_pc_budget = absl::GetFlag(FLAGS_spec_pc_budget);
  options.spec_pc_lookahead_tokens = absl::GetFlag(FLAGS_spec_pc_lookahead_tokens);
  options.spec_kv_budget = absl::GetFlag(FLAGS_spec_kv_budget);
  options.spec_kv_lookahead_tokens = absl::GetFlag(FLAGS_spec_kv_lookahead_tokens);
  ServerMetrics metrics(
      [&engine = *engine] { return engine.stats(); },
      {RIDGESERVE_VERSION, model->config.name, options.backend, options.tensor_parallel});
  metrics.SetRidgeFillMaps([&maps = *maps] { return maps.Snapshot(); });
  if (online != nullptr) metrics.SetRidgeFillOnline([c = online.get()] { return c->status(); });
  RS_RETURN_IF_ERROR(ServeMetrics(metrics));
  std::unique_ptr<RidgeFillShadow> shadow;
  if (const double fraction = absl::GetFlag(FLAGS_ridgefill_shadow_fraction); fraction > 0) {
    shadow = std::make_unique<RidgeFillShadow>(*engine, metrics, fraction, std::random_device{}());
    spdlog::info(
        "RidgeFill shadow sampling: the exact prefill of {:.1f}% of RIDGEFILL requests "
        "runs on idle capacity",
        100 * fraction);
  }
  InferenceService service(*model, *engine, options, metrics, *maps, shadow.get());
  AdminService admin(security.admin != nullptr, *maps);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string host = absl::GetFlag(FLAGS_host);
  int port = 0;
  builder.AddListeningPort(ListenAddress(host, absl::GetFlag(FLAGS_port)), security.credentials,
                           &port);
  builder.RegisterService(&service);
  builder.RegisterService(&admin);
  // A second server on a busy port must fail, not share the port with the first.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(absl::GetFlag(FLAGS_max_request_bytes));
  builder.SetMaxSendMessageSize(kMaxResponseBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             absl::GetFlag(FLAGS_max_concurrent_streams));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", ListenAddress(host, absl::GetFlag(FLAGS_port))));
  }
  // gRPC's health service starts out SERVING; it is not until the warm-up ran.
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  {
    std::lock_guard lock(health_mu);
    health_service = health;
    health->SetServingStatus(false);
  }
  // The engine outlives the server: it must not reach the health service once that is gone.
  absl::Cleanup forget_health = [&] {
    std::lock_guard lock(health_mu);
    health_service = nullptr;
  };
  spdlog::info("listening on {} ({}; health NOT_SERVING until warmed up)",
               ListenAddress(host, port), security.description);

  if (absl::Status warm = WarmUp(*engine, *model, kWarmUpTimeout); !warm.ok()) {
    server->Shutdown(absl::ToChronoTime(absl::Now()));
    return absl::Status(warm.code(), absl::StrCat("warm-up failed: ", warm.message()));
  }
  if (std::lock_guard lock(health_mu); signals.count() == 0 && !engine_broken) {
    health->SetServingStatus(true);
    spdlog::info("serving on {}", ListenAddress(host, port));
  }

  const int signal = signals.Wait();
  spdlog::info("received signal {}: shutting down", signal);
  Drain(service, *server, signals);
  spdlog::info("stopped");
  return absl::OkStatus();
}

}  // namespace
}  // namespace ridgeserve

int main(int argc, char** argv) {
  // First, so that a signal during start-up is seen once serving would begin.
  ridgeserve::ShutdownSignal signals;
  absl::SetProgramUsageMessage(
      "gRPC LLM inference server.\n  ridgeserve --model models/SmolLM2-135M-Instruct.Q4_1.gguf "
      "--port 50051");
  absl::ParseCommandLine(argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("ridgeserve"));

  // Usage errors in the security, limit, capacity, SpecPC and SpecKV flags: one line, exit code 2.
  absl::StatusOr<ridgeserve::PortSecurity> security = ridgeserve::PortSecurityFromFlags();
  absl::Status usage = security.status();
  if (usage.ok()) usage = ridgeserve::CheckLimitFlags();
  if (usage.ok()) usage = ridgeserve::CheckDraftFlags();
  if (!usage.ok()) {
    spdlog::error("{}", std::string(usage.message()));
    return 2;
  }
  if (absl::Status status = ridgeserve::Serve(signals, *security); !status.ok()) {
    spdlog::error("{}", status.ToString());
    return 1;
  }
  return 0;
}
