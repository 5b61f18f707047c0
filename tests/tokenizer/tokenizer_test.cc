// Unit tests of the tokenizer: chat templates (SmolLM2's real GGUF, a hand-built Llama 3
// tokenizer.json), the streaming detokenizer, malformed tokenizer.json files, the BPE merge
// loop against a naive reference, and scaling on long pieces. Token-id parity with Hugging
// Face tokenizers on a large corpus lives in tokenizer_parity_test.py.
#include "engine/tokenizer/tokenizer.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/pretokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ridgeserve {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

// ---------------------------------------------------------------------------- helpers

// Independent UTF-8 validity check (the obvious state machine, written from RFC 3629).
bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int n;
    uint32_t cp;
    if (c < 0x80) {
      n = 0;
      cp = c;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= n; ++k) {
      const unsigned char d = s[i + k];
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "rs_tok_XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(std::filesystem::path(path_) / name, std::ios::binary) << text;
  }

 private:
  std::string path_;
};

std::string B(uint8_t byte) { return std::string(ByteLevelChar(byte)); }

// A tiny byte-level vocabulary: ids 0..255 are the byte symbols, then the merges' results.
struct TinyVocab {
  Json vocab = Json::object();
  Json merges = Json::array();
  int next_id = 256;
  TinyVocab() {
    for (int b = 0; b < 256; ++b) vocab[B(static_cast<uint8_t>(b))] = b;
  }
  // Adds merge "left right" (byte-level strings) and its result token.
  void Merge(const std::string& left, const std::string& right) {
    merges.push_back(left + " " + right);
    if (!vocab.contains(left + right)) vocab[left + right] = next_id++;
  }
};

Json TokenizerJson(const TinyVocab& v, const Json& pre_tokenizer, const Json& added_tokens) {
  return {{"version", "1.0"},
          {"added_tokens", added_tokens},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"vocab", v.vocab}, {"merges", v.merges}, {"ignore_merges", true}}}};
}

Json Added(int id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},   {"special", special}, {"lstrip", false},
          {"rstrip", false}, {"single_word", false}, {"normalized", false}};
}

const Json kGpt2ByteLevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}};

std::unique_ptr<Tokenizer> LoadHf(const TempDir& dir) {
  auto t = Tokenizer::FromHfDir(dir.path());
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *std::move(t) : nullptr;
}

// ---------------------------------------------------------------------------- SmolLM2

class TokenizerSmolLM2Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto gguf = GgufFile::Open(RIDGESERVE_DEFAULT_MODEL);
    ASSERT_TRUE(gguf.ok()) << gguf.status() << " (make model fetches it)";
    gguf_ = gguf->release();
    auto tokenizer = Tokenizer::FromGguf(*gguf_);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = tokenizer->release();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    delete gguf_;
  }
  static GgufFile* gguf_;
  static Tokenizer* tokenizer_;
};
GgufFile* TokenizerSmolLM2Test::gguf_ = nullptr;
Tokenizer* TokenizerSmolLM2Test::tokenizer_ = nullptr;

TEST_F(TokenizerSmolLM2Test, SpecialIds) {
  const Tokenizer& t = *tokenizer_;
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_THAT(t.end_of_generation_ids(), Contains(0));
  EXPECT_THAT(t.end_of_generation_ids(), Contains(2));
  EXPECT_THAT(t.end_of_generation_ids(), testing::Not(Contains(1)));
  for (int id = 0; id <= 16; ++id) EXPECT_TRUE(t.IsSpecial(id)) << id;
  EXPECT_FALSE(t.IsSpecial(17));
  EXPECT_EQ(t.TokenBytes(1), "<|im_start|>");
  // add_bos_token is False in this GGUF: no BOS even when the caller allows it.
  EXPECT_EQ(t.Encode("Hello", /*add_bos=*/true, true), t.Encode("Hello", false, true));
}

TEST_F(TokenizerSmolLM2Test, ChatMLWithDefaultSystemPrompt) {
  const Tokenizer& t = *tokenizer_;
  EXPECT_EQ(t.chat_template(), ChatTemplateKind::kChatML);
  const std::vector<ChatMessage> messages = {{"user", "What is the capital of France?"}};
  EXPECT_EQ(t.ApplyChatTemplate(messages, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
            "<|im_start|>assistant\n");
  const std::vector<ChatMessage> with_system = {
      {"system", "Be terse."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(t.ApplyChatTemplate(with_system, false),
            "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n");
  // The control tokens of the prompt encode to their ids.
  const std::vector<int32_t> ids = t.Encode(t.ApplyChatTemplate(messages, true), false, true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
}

TEST_F(TokenizerSmolLM2Test, ParseSpecialOff) {
  const Tokenizer& t = *tokenizer_;
  const std::vector<int32_t> ids = t.Encode("<|im_start|>", false, /*parse_special=*/false);
  EXPECT_GT(ids.size(), 1u);
  for (int32_t id : ids) EXPECT_FALSE(t.IsSpecial(id));
  EXPECT_EQ(t.Decode(ids), "<|im_start|>");
  EXPECT_THAT(t.Encode("<|im_start|>", false, true), ElementsAre(1));
}

TEST_F(TokenizerSmolLM2Test, DecodeSkipSpecial) {
  const Tokenizer& t = *tokenizer_;
  const std::vector<int32_t> ids = t.Encode("<|im_start|>user\nhi<|im_end|>", false, true);
  EXPECT_EQ(t.Decode(ids), "<|im_start|>user\nhi<|im_end|>");
  EXPECT_EQ(t.Decode(ids, /*skip_special=*/true), "user\nhi");
}

TEST_F(TokenizerSmolLM2Test, InvalidUtf8RoundTrips) {
  const Tokenizer& t = *tokenizer_;
  // Stray continuation, truncated sequences, an encoded surrogate: all bytes whose symbols
  // SmolLM2's vocabulary has, so they survive.
  const std::string text = "ok \x80\xbf caf\xc3 \xe6\x97 \xed\xa0\x80 end\xf0\x9f\x98";
  EXPECT_EQ(t.Decode(t.Encode(text, false, true)), text);
  // Bytes with no symbol in the vocabulary (0x04, 0xFF, ...) are dropped, as tokenizers
  // drops characters missing from a BPE vocabulary without an unk token.
  EXPECT_EQ(t.Decode(t.Encode("a\x04"
                              "b\xff",
                              false, true)),
            "ab");
}

TEST_F(TokenizerSmolLM2Test, StreamDecoderNeverSplitsCharacters) {
  const Tokenizer& t = *tokenizer_;
  const std::string text =
      "Family 👨‍👩‍👧‍👦 flag 🇫🇷 "
      "日本語のテキスト 中文 "
      "한국어 🧑🏿‍💻 "
      "naïve café 🫠 done";
  const std::vector<int32_t> ids = t.Encode(text, false, true);
  // The test only means something if some tokens hold partial characters.
  int partial_tokens = 0;
  for (int32_t id : ids) partial_tokens += ValidUtf8(t.TokenBytes(id)) ? 0 : 1;
  EXPECT_GE(partial_tokens, 5);

  StreamDecoder decoder(t);
  std::string streamed;
  for (int32_t id : ids) {
    const std::string piece = decoder.Push(id);
    EXPECT_TRUE(ValidUtf8(piece)) << "token " << id;
    streamed += piece;
  }
  streamed += decoder.Flush();
  EXPECT_EQ(streamed, t.Decode(ids));
  EXPECT_EQ(streamed, text);
}

TEST_F(TokenizerSmolLM2Test, StreamDecoderSkipsSpecialTokens) {
  const Tokenizer& t = *tokenizer_;
  StreamDecoder decoder(t);
  std::string out;
  for (int32_t id : t.Encode("<|im_start|>assistant\nOK<|im_end|>", false, true)) {
    out += decoder.Push(id);
  }
  out += decoder.Flush();
  EXPECT_EQ(out, "assistant\nOK");
}

// ---------------------------------------------------------------------------- Llama 3

constexpr char kLlama3Template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

TEST(TokenizerLlama3Test, ChatTemplateAndSpecialTokens) {
  TinyVocab v;
  v.Merge("H", "i");
  v.Merge(B(' '), "t");
  v.Merge(B(' ') + "t", "h");
  const Json added = Json::array({Added(300, "<|begin_of_text|>"), Added(301, "<|end_of_text|>"),
                                  Added(302, "<|start_header_id|>"),
                                  Added(303, "<|end_header_id|>"), Added(304, "<|eot_id|>")});
  const Json pre = {{"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Split"},
                       {"pattern", {{"Regex", std::string(kLlama3Pattern)}}},
                       {"behavior", "Isolated"},
                       {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  Json tokenizer = TokenizerJson(v, pre, added);
  tokenizer["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single",
       {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}};
  TempDir dir;
  dir.Write("tokenizer.json", tokenizer.dump());
  dir.Write("tokenizer_config.json", Json{{"bos_token", "<|begin_of_text|>"},
                                          {"eos_token", "<|eot_id|>"},
                                          {"chat_template", kLlama3Template}}
                                         .dump());
  dir.Write("generation_config.json", R"({"eos_token_id": [301, 304]})");
  auto t = LoadHf(dir);
  ASSERT_NE(t, nullptr);

  EXPECT_EQ(t->chat_template(), ChatTemplateKind::kLlama3);
  EXPECT_EQ(t->bos_id(), 300);
  EXPECT_EQ(t->eos_id(), 304);
  EXPECT_THAT(t->end_of_generation_ids(), ElementsAre(301, 304));
  const std::vector<ChatMessage> messages = {{"system", "Be brief."}, {"user", "  Hi there \n"}};
  const std::string prompt = t->ApplyChatTemplate(messages, true);
  EXPECT_EQ(prompt,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(t->ApplyChatTemplate(messages, false).find("assistant"), std::string::npos);

  // The post-processor's template makes add_bos effective; the prompt carries its own BOS.
  EXPECT_THAT(t->Encode("Hi", true, false), ElementsAre(300, 256));
  const std::vector<int32_t> ids = t->Encode(prompt, false, true);
  EXPECT_EQ(ids.front(), 300);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 302), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 304), 2);
  EXPECT_EQ(t->Decode(ids), prompt);
  // " th" merges in two steps by rank; "Hi" in one.
  EXPECT_THAT(t->Encode(" the", false, false), ElementsAre(258, 'e'));
}

TEST(TokenizerChatTemplateTest, DefaultSystemPromptExtraction) {
  // Qwen2: the default system text sits in a literal inside an if.
  EXPECT_EQ(ExtractChatMLDefaultSystem(
                "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
                "'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' "
                "}}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                "'<|im_end|>' + '\n'}}{% endfor %}"),
            "You are a helpful assistant.");
  // Qwen2.5: a system header concatenated with an expression comes first and is skipped.
  EXPECT_EQ(ExtractChatMLDefaultSystem(
                "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
                "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- "
                "'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                "assistant.<|im_end|>\\n' }}{%- endif %}"),
            "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  // No default at all (Qwen3-style): nothing is inserted.
  EXPECT_EQ(ExtractChatMLDefaultSystem("{%- for message in messages %}{{- '<|im_start|>' + "
                                       "message.role + '\\n' + message.content + "
                                       "'<|im_end|>' + '\\n' }}{%- endfor %}"),
            "");
  const ChatTemplate none = ChatTemplate::Detect("{{ '<|im_start|>' }}", true, false, "");
  const std::vector<ChatMessage> messages = {{"user", "x"}};
  EXPECT_EQ(none.Render(messages, false), "<|im_start|>user\nx<|im_end|>\n");
}

// ---------------------------------------------------------------------------- added tokens

TEST(TokenizerAddedTokensTest, UserDefinedAlwaysSplitSpecialOnlyWhenParsed) {
  TinyVocab v;
  const Json added = Json::array(
      {Added(256, "<ctl>", true), Added(257, "<usr>", false), Added(258, "<ctl>long", true)});
  TempDir dir;
  dir.Write("tokenizer.json", TokenizerJson(v, kGpt2ByteLevel, added).dump());
  auto t = LoadHf(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("a<usr>b", false, false), ElementsAre('a', 257, 'b'));
  EXPECT_THAT(t->Encode("<ctl>", false, true), ElementsAre(256));
  EXPECT_THAT(t->Encode("<ctl>", false, false), ElementsAre('<', 'c', 't', 'l', '>'));
  // Leftmost-longest.
  EXPECT_THAT(t->Encode("<ctl>longer", false, true), ElementsAre(258, 'e', 'r'));
  EXPECT_TRUE(t->IsSpecial(256));
  EXPECT_FALSE(t->IsSpecial(257));
  EXPECT_EQ(t->Decode(std::vector<int32_t>{256, 'x', 257}, /*skip_special=*/true), "x<usr>");
}

TEST(TokenizerAddedTokensTest, LstripRstripAbsorbWhitespace) {
  TinyVocab v;
  Json token = Added(256, "<mask>");
  token["lstrip"] = true;
  token["rstrip"] = true;
  TempDir dir;
  dir.Write("tokenizer.json", TokenizerJson(v, kGpt2ByteLevel, Json::array({token})).dump());
  auto t = LoadHf(dir);
  ASSERT_NE(t, nullptr);
  EXPECT_THAT(t->Encode("a  <mask> \tb", false, true), ElementsAre('a', 256, 'b'));
}

// ---------------------------------------------------------------------------- StreamDecoder

TEST(TokenizerStreamDecoderTest, ByteTokensAndInvalidBytes) {
  TinyVocab v;  // every byte its own token: a 4-byte emoji arrives in 4 pushes
  TempDir dir;
  dir.Write("tokenizer.json", TokenizerJson(v, kGpt2ByteLevel, Json::array()).dump());
  auto t = LoadHf(dir);
  ASSERT_NE(t, nullptr);
  StreamDecoder d(*t);
  EXPECT_EQ(d.Push(0xF0), "");
  EXPECT_EQ(d.Push(0x9F), "");
  EXPECT_EQ(d.Push(0x98), "");
  EXPECT_EQ(d.Push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.Push('a'), "a");
  // A byte that can never start a character is replaced at once, not held back.
  EXPECT_EQ(d.Push(0xFF), "\xEF\xBF\xBD");
  // A lead byte followed by a non-continuation: U+FFFD then the byte.
  EXPECT_EQ(d.Push(0xE6), "");
  EXPECT_EQ(d.Push('b'),
            "\xEF\xBF\xBD"
            "b");
  // Leftovers at the end become U+FFFD.
  EXPECT_EQ(d.Push(0xC3), "");
  EXPECT_EQ(d.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.Flush(), "");
}

// ---------------------------------------------------------------------------- errors

TEST(TokenizerMalformedJsonTest, ClearErrors) {
  {
    TempDir dir;
    auto t = Tokenizer::FromHfDir(dir.path());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(t.status().message(), HasSubstr("tokenizer.json"));
  }
  {
    TempDir dir;
    dir.Write("tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0},)");
    auto t = Tokenizer::FromHfDir(dir.path());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("tokenizer.json"));
    EXPECT_THAT(t.status().message(), HasSubstr("parse error"));
  }
  {
    TempDir dir;
    Json j = TokenizerJson(TinyVocab(), kGpt2ByteLevel, Json::array());
    j["model"].erase("vocab");
    dir.Write("tokenizer.json", j.dump());
    auto t = Tokenizer::FromHfDir(dir.path());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("model.vocab is missing"));
  }
  {
    TempDir dir;
    TinyVocab v;
    v.Merge("a", "b");
    v.merges.push_back("a zzz");
    dir.Write("tokenizer.json", TokenizerJson(v, kGpt2ByteLevel, Json::array()).dump());
    auto t = Tokenizer::FromHfDir(dir.path());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("merge 1 \"a zzz\""));
    EXPECT_THAT(t.status().message(), HasSubstr("not in the vocabulary"));
  }
  {
    TempDir dir;
    Json j = TokenizerJson(TinyVocab(), kGpt2ByteLevel, Json::array());
    j["model"]["type"] = "WordPiece";
    dir.Write("tokenizer.json", j.dump());
    EXPECT_EQ(Tokenizer::FromHfDir(dir.path()).status().code(), absl::StatusCode::kUnimplemented);
  }
  {
    TempDir dir;
    const Json pre = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}}, kGpt2ByteLevel}}};
    dir.Write("tokenizer.json", TokenizerJson(TinyVocab(), pre, Json::array()).dump());
    auto t = Tokenizer::FromHfDir(dir.path());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("(unclosed"));
  }
  {
    TempDir dir;
    Json j = TokenizerJson(TinyVocab(), kGpt2ByteLevel, Json::array());
    j["model"]["merges"] = Json::array({42});
    dir.Write("tokenizer.json", j.dump());
    auto t = Tokenizer::FromHfDir(dir.path());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("model.merges[0]"));
  }
  {
    // An absurd id (fuzzing found 988,888,887: a 31.6 GB token table) in the vocabulary or in
    // added_tokens is refused before anything is allocated; the largest id allowed loads.
    const int64_t max_id = (int64_t{1} << 21) - 1;
    for (const bool in_vocab : {true, false}) {
      for (const int64_t id : {int64_t{988888887}, int64_t{INT32_MAX}, max_id + 1, max_id}) {
        TempDir dir;
        TinyVocab v;
        Json added = Json::array();
        if (in_vocab) {
          v.vocab["far"] = id;
        } else {
          added.push_back(Added(0, "<|x|>"));
          added[0]["id"] = id;
        }
        dir.Write("tokenizer.json", TokenizerJson(v, kGpt2ByteLevel, added).dump());
        auto t = Tokenizer::FromHfDir(dir.path());
        if (id == max_id) {
          ASSERT_TRUE(t.ok()) << t.status();
          EXPECT_EQ((*t)->vocab_size(), max_id + 1);
          continue;
        }
        EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << id;
        EXPECT_THAT(t.status().message(),
                    HasSubstr(in_vocab ? "model.vocab[\"far\"]" : "added_tokens[0]"));
        EXPECT_THAT(t.status().message(), HasSubstr("2097151"));
      }
    }
  }
  {
    TempDir dir;  // tokenizer_config.json names a token the vocabulary lacks
    dir.Write("tokenizer.json", TokenizerJson(TinyVocab(), kGpt2ByteLevel, Json::array()).dump());
    dir.Write("tokenizer_config.json", R"({"eos_token": "<|nope|>"})");
    auto t = Tokenizer::FromHfDir(dir.path());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(t.status().message(), HasSubstr("<|nope|>"));
  }
}

// ---------------------------------------------------------------------------- BPE

// The textbook BPE loop: repeatedly merge the adjacent pair of lowest rank, leftmost first.
// O(n^2 * merges) per word; fine for short random words.
std::vector<std::string> NaiveBpe(const std::string& word,
                                  const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> symbols;
  for (char c : word) symbols.push_back(std::string(1, c));
  while (true) {
    size_t best_rank = merges.size(), best_pos = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      for (size_t r = 0; r < best_rank; ++r) {
        if (merges[r].first == symbols[i] && merges[r].second == symbols[i + 1]) {
          best_rank = r;
          best_pos = i;
          break;
        }
      }
    }
    if (best_rank == merges.size()) return symbols;
    symbols[best_pos] += symbols[best_pos + 1];
    symbols.erase(symbols.begin() + best_pos + 1);
  }
}

TEST(TokenizerBpeTest, MatchesNaiveReferenceOnRandomMerges) {
  std::mt19937 rng(7);
  const std::string alphabet = "abcd";
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(B(static_cast<uint8_t>(b)));
  // Random merges among existing tokens (ASCII letters map to themselves).
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> pool = {"a", "b", "c", "d"};
  for (int i = 0; i < 60; ++i) {
    const std::string l = pool[rng() % pool.size()], r = pool[rng() % pool.size()];
    if (l.size() + r.size() > 6) continue;
    merges.emplace_back(l, r);
    if (std::find(tokens.begin(), tokens.end(), l + r) == tokens.end()) {
      tokens.push_back(l + r);
      pool.push_back(l + r);
    }
  }
  auto model = BpeModel::Create(tokens, merges, BpeOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  for (int trial = 0; trial < 300; ++trial) {
    std::string word;
    const int len = 1 + rng() % 24;
    for (int i = 0; i < len; ++i) word += alphabet[rng() % alphabet.size()];
    std::vector<int32_t> ids;
    model->Encode(word, &ids);
    std::vector<std::string> ours;
    for (int32_t id : ids) ours.push_back(tokens[id]);
    // Repeated pairs take their last rank in both implementations.
    std::vector<std::pair<std::string, std::string>> effective;
    for (size_t r = 0; r < merges.size(); ++r) {
      bool later = false;
      for (size_t s = r + 1; s < merges.size(); ++s) later |= merges[s] == merges[r];
      effective.push_back(later ? std::make_pair(std::string("\x01"), std::string("\x01"))
                                : merges[r]);
    }
    EXPECT_EQ(ours, NaiveBpe(word, effective)) << word;
  }
}

TEST_F(TokenizerSmolLM2Test, LongPiecesScale) {
  // Long whitespace runs, one long letter run and one long mixed word: each is one piece
  // for BPE, so a quadratic merge loop or regex would take seconds here.
  const Tokenizer& t = *tokenizer_;
  std::string mixed;
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) mixed += "abcdefgh"[rng() % 8];
  const std::vector<std::string> inputs = {std::string(1 << 20, ' ') + "x",
                                           std::string(200000, '\n'), std::string(200000, 'a'),
                                           mixed, std::string(100000, '\t') + " \t"};
  for (const std::string& text : inputs) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = t.Encode(text, false, true);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 2.0) << text.size() << " bytes";
    EXPECT_EQ(t.Decode(ids), text);
  }
}

}  // namespace
}  // namespace ridgeserve
