// tokenize_dump: encodes a file of documents with ridgeserve's tokenizer so a test can
// compare the ids against Hugging Face tokenizers in one process.
//
//   tokenize_dump (--gguf=FILE | --hf_dir=DIR) --input=FILE --ids_out=FILE
//                 --decoded_out=FILE [--parse_special=1] [--add_bos=0]
//
// Input and --decoded_out hold records "<byte length>\n<bytes>\n". --ids_out holds one line
// of space-separated ids per record. --decoded_out holds Decode(Encode(doc)).
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/tokenizer/tokenizer.h"

namespace {

int Fail(const std::string& message) {
  std::cerr << "tokenize_dump: " << message << "\n";
  return 1;
}

bool ReadRecords(const std::string& path, std::vector<std::string>* docs) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::string header;
  while (std::getline(in, header)) {
    if (header.empty()) continue;
    size_t length = 0;
    const char* end = header.data() + header.size();
    if (std::from_chars(header.data(), end, length).ptr != end) return false;  // not a length
    std::string doc(length, '\0');
    in.read(doc.data(), static_cast<std::streamsize>(length));
    if (static_cast<size_t>(in.gcount()) != length) return false;
    in.get();  // the newline after the bytes
    docs->push_back(std::move(doc));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string gguf_path, hf_dir, input, ids_out, decoded_out;
  bool parse_special = true;
  bool add_bos = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (key == "--gguf") {
      gguf_path = value;
    } else if (key == "--hf_dir") {
      hf_dir = value;
    } else if (key == "--input") {
      input = value;
    } else if (key == "--ids_out") {
      ids_out = value;
    } else if (key == "--decoded_out") {
      decoded_out = value;
    } else if (key == "--parse_special") {
      parse_special = value != "0";
    } else if (key == "--add_bos") {
      add_bos = value != "0";
    } else {
      return Fail("unknown flag " + arg);
    }
  }
  if (gguf_path.empty() == hf_dir.empty() || input.empty() || ids_out.empty() ||
      decoded_out.empty()) {
    return Fail("usage: (--gguf=FILE | --hf_dir=DIR) --input=F --ids_out=F --decoded_out=F");
  }

  std::unique_ptr<ridgeserve::GgufFile> gguf;
  absl::StatusOr<std::unique_ptr<ridgeserve::Tokenizer>> tokenizer;
  if (!gguf_path.empty()) {
    auto opened = ridgeserve::GgufFile::Open(gguf_path);
    if (!opened.ok()) return Fail(opened.status().ToString());
    gguf = *std::move(opened);
    tokenizer = ridgeserve::Tokenizer::FromGguf(*gguf);
  } else {
    tokenizer = ridgeserve::Tokenizer::FromHfDir(hf_dir);
  }
  if (!tokenizer.ok()) return Fail(tokenizer.status().ToString());

  std::vector<std::string> docs;
  if (!ReadRecords(input, &docs))
    return Fail(input + ": not records of a byte-length line and that many bytes");

  std::ofstream ids_file(ids_out, std::ios::binary);
  std::ofstream decoded_file(decoded_out, std::ios::binary);
  size_t bytes = 0, tokens = 0;
  double encode_seconds = 0;
  for (const std::string& doc : docs) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = (*tokenizer)->Encode(doc, add_bos, parse_special);
    encode_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bytes += doc.size();
    tokens += ids.size();
    for (size_t i = 0; i < ids.size(); ++i) ids_file << (i ? " " : "") << ids[i];
    ids_file << "\n";
    const std::string decoded = (*tokenizer)->Decode(ids, /*skip_special=*/false);
    decoded_file << decoded.size() << "\n" << decoded << "\n";
  }
  if (!ids_file || !decoded_file) return Fail("write failed");
  std::cerr << "tokenize_dump: " << docs.size() << " docs, " << bytes << " bytes -> " << tokens
            << " tokens, encode " << encode_seconds * 1e3 << " ms ("
            << (encode_seconds > 0 ? bytes / encode_seconds / 1e6 : 0) << " MB/s)\n";
  return 0;
}
