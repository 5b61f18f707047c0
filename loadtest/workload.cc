#include "loadtest/workload.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ridgeserve::loadtest {
namespace {

// Bytes of text per Tokenize call: small enough for any message limit and a quick reply.
constexpr size_t kTokenizePieceBytes = 256 << 10;
// The prefill mix is exact within every block of requests (in a seeded order inside the
// block); the block is the shortest that holds every share exactly (2 for 0.5, 4 for 0.25), so
// the modes see the same load over any stretch of the run, else this many (shares rounded).
constexpr int kMaxModeBlock = 20;
constexpr double kShareTolerance = 1e-9;

int ModeBlock(const ModeShares& shares) {
  for (int n = 1; n < kMaxModeBlock; ++n) {
    if (std::all_of(shares.begin(), shares.end(), [n](double share) {
          return std::abs(share * n - std::round(share * n)) < kShareTolerance;
        })) {
      return n;
    }
  }
  return kMaxModeBlock;
}

// Requests of each mode in a block of `block`: the shares' floors, and the requests left over
// to the largest remainders (the lower kind first on a tie).
std::array<int, kNumPrefillKinds> ModeCounts(const ModeShares& shares, int block) {
  std::array<int, kNumPrefillKinds> counts{};
  std::array<double, kNumPrefillKinds> remainder{};
  int left = block;
  for (int k = 0; k < kNumPrefillKinds; ++k) {
    const double exact = shares[k] * block;
    counts[k] = static_cast<int>(std::floor(exact + kShareTolerance));
    remainder[k] = exact - counts[k];
    left -= counts[k];
  }
  for (; left > 0; --left) {
    const int k =
        static_cast<int>(std::max_element(remainder.begin(), remainder.end()) - remainder.begin());
    ++counts[k];
    remainder[k] = -1;
  }
  return counts;
}

// Where to end a piece that starts at `begin`: after the last whitespace before the limit, so
// no word (and no UTF-8 character) is split; else at a UTF-8 character boundary.
size_t PieceEnd(const std::string& text, size_t begin) {
  const size_t limit = std::min(text.size(), begin + kTokenizePieceBytes);
  if (limit == text.size()) return limit;
  for (size_t i = limit; i > begin + kTokenizePieceBytes / 2; --i) {
    const char c = text[i - 1];
    if (c == ' ' || c == '\n' || c == '\t') return i;
  }
  size_t end = limit;
  while (end > begin + 1 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return end;
}

std::mt19937_64 StreamRng(uint64_t seed, uint64_t stream) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                    static_cast<uint32_t>(stream)};
  return std::mt19937_64(seq);
}

}  // namespace

absl::StatusOr<TokenCorpus> LoadTokenCorpus(v1::Inference::Stub& stub, const std::string& path,
                                            size_t max_bytes, bool keep_text, double timeout_s) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--text: cannot open ", path));
  std::string text(max_bytes, '\0');
  in.read(text.data(), static_cast<std::streamsize>(max_bytes));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.empty()) return absl::InvalidArgumentError(absl::StrCat("--text: ", path, " is empty"));

  TokenCorpus corpus;
  if (keep_text) corpus.text_offsets.push_back(0);
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = PieceEnd(text, begin);
    v1::TokenizeRequest request;
    request.set_text(text.substr(begin, end - begin));
    request.set_add_special_tokens(false);
    v1::TokenizeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    if (grpc::Status s = stub.Tokenize(&context, request, &response); !s.ok()) {
      return absl::Status(
          static_cast<absl::StatusCode>(s.error_code()),
          absl::StrCat("Tokenize of ", path, " at byte ", begin, ": ", s.error_message()));
    }
    corpus.ids.insert(corpus.ids.end(), response.token_ids().begin(), response.token_ids().end());
    if (keep_text) {
      for (const std::string& token : response.tokens()) {
        corpus.text += token;
        corpus.text_offsets.push_back(corpus.text.size());
      }
    }
    begin = end;
  }
  return corpus;
}

absl::StatusOr<ModeShares> ParseModeShare(absl::string_view text) {
  ModeShares shares{};
  std::array<bool, kNumPrefillKinds> named{};
  double sum = 0;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    const PrefillKind* kind =
        std::find_if(std::begin(kPrefillKinds), std::end(kPrefillKinds),
                     [&kv](PrefillKind k) { return kv.first == PrefillKindName(k); });
    if (kind == std::end(kPrefillKinds)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mode_share: \"", item,
                       "\" is not MODE=SHARE with MODE exact, ridgefill, spec_pc or spec_kv"));
    }
    const int k = static_cast<int>(kind - std::begin(kPrefillKinds));
    if (named[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mode_share: ", kv.first, " is given twice"));
    }
    named[k] = true;
    double share = 0;
    if (!absl::SimpleAtod(kv.second, &share) || !(share >= 0 && share <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mode_share: ", kv.first, " share \"", kv.second, "\" is not in [0, 1]"));
    }
    shares[k] = share;
    sum += share;
  }
  if (std::abs(sum - 1) > 1e-6) {
    return absl::InvalidArgumentError(
        absl::StrCat("--mode_share: the shares sum to ", sum, ", not 1"));
  }
  return shares;
}

absl::StatusOr<RequestFactory> RequestFactory::Create(WorkloadOptions options, TokenCorpus corpus) {
  const int32_t longest = options.prompt_tokens.Max();
  if (static_cast<int64_t>(corpus.ids.size()) < longest) {
    return absl::InvalidArgumentError(
        absl::StrCat("--text has ", corpus.ids.size(), " tokens, fewer than the longest prompt (",
                     longest, "); use a longer file or raise --text_max_bytes"));
  }
  return RequestFactory(std::move(options), std::move(corpus));
}

RequestFactory::RequestFactory(WorkloadOptions options, TokenCorpus corpus)
    : options_(std::move(options)),
      corpus_(std::move(corpus)),
      length_rng_(StreamRng(options_.seed, 1)),
      offset_rng_(StreamRng(options_.seed, 2)),
      mode_rng_(StreamRng(options_.seed, 3)) {}

PrefillKind RequestFactory::NextMode() {
  if (mode_block_.empty()) {
    const int block = ModeBlock(options_.mode_share);
    const std::array<int, kNumPrefillKinds> counts = ModeCounts(options_.mode_share, block);
    // RidgeFill, SpecPC, SpecKV, then exact before the shuffle: a RidgeFill-only mix is the one
    // --ridgefill_share always gave for the same seed, and a mix without SpecKV the one it gave
    // before SpecKV was added.
    for (PrefillKind kind : {PrefillKind::kRidgeFill, PrefillKind::kSpecPc, PrefillKind::kSpecKv,
                             PrefillKind::kExact}) {
      mode_block_.insert(mode_block_.end(), counts[static_cast<int>(kind)], kind);
    }
    std::shuffle(mode_block_.begin(), mode_block_.end(), mode_rng_);
  }
  const PrefillKind kind = mode_block_.back();
  mode_block_.pop_back();
  return kind;
}

PlannedRequest RequestFactory::Next() {
  PlannedRequest p;
  p.prompt_tokens = options_.prompt_tokens.Sample(length_rng_);
  p.max_new_tokens = options_.output_tokens.Sample(length_rng_);
  p.mode = NextMode();
  const size_t last_offset = corpus_.ids.size() - static_cast<size_t>(p.prompt_tokens);
  const size_t offset = std::uniform_int_distribution<size_t>(0, last_offset)(offset_rng_);

  v1::GenerateRequest& r = p.request;
  r.set_request_id(absl::StrCat(options_.request_id_prefix, issued_++));
  if (options_.chat) {
    v1::ChatMessage& user = *r.mutable_chat()->add_messages();
    user.set_role("user");
    const size_t begin = corpus_.text_offsets[offset];
    const size_t end = corpus_.text_offsets[offset + static_cast<size_t>(p.prompt_tokens)];
    user.set_content(corpus_.text.substr(begin, end - begin));
  } else {
    const auto first = corpus_.ids.begin() + static_cast<std::ptrdiff_t>(offset);
    r.mutable_token_ids()->mutable_ids()->Add(first, first + p.prompt_tokens);
  }
  v1::SamplingParams& s = *r.mutable_sampling();
  s.set_temperature(options_.temperature);
  s.set_max_new_tokens(p.max_new_tokens);
  if (options_.ignore_eos) s.set_ignore_eos(true);
  v1::PrefillOptions& prefill = *r.mutable_prefill();
  if (p.mode == PrefillKind::kRidgeFill) {
    prefill.set_mode(v1::PrefillOptions::RIDGEFILL);
    if (options_.exact_tail_tokens) {
      prefill.mutable_ridgefill()->set_exact_tail_tokens(*options_.exact_tail_tokens);
    }
    if (options_.split_layer) prefill.mutable_ridgefill()->set_split_layer(*options_.split_layer);
  } else if (p.mode == PrefillKind::kSpecPc) {
    prefill.set_mode(v1::PrefillOptions::SPEC_PC);
    if (options_.spec_pc_budget) prefill.mutable_spec_pc()->set_budget(*options_.spec_pc_budget);
  } else if (p.mode == PrefillKind::kSpecKv) {
    prefill.set_mode(v1::PrefillOptions::SPEC_KV);
    if (options_.spec_kv_budget) prefill.mutable_spec_kv()->set_budget(*options_.spec_kv_budget);
  } else {
    prefill.set_mode(v1::PrefillOptions::EXACT);
  }
  return p;
}

}  // namespace ridgeserve::loadtest
