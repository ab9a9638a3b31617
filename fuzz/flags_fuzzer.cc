// Fuzzes the CLI's flag parser: the input is a command line, one argument per line. The
// FlagSet either accepts it (every value then parsed as its type says) or refuses it with a
// message; the token-count parsers (--context 32K) likewise, their results positive and in
// range.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "cli/flags.h"
#include "fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> args = absl::StrSplit(text, '\n');

  std::string model, context;
  int64_t block_size = 16;
  double rate = 0;
  bool compare = false;
  kvpage::cli::FlagSet fs("fuzz");
  fs.String("model", &model, "model");
  fs.String("context", &context, "context");
  fs.Int("block-size", &block_size, "block size");
  fs.Double("request-rate", &rate, "rate");
  fs.Bool("compare", &compare, "compare");
  bool help = false;
  const absl::Status parsed = fs.Parse(args, &help);
  if (!parsed.ok()) {
    kvpage::fuzz::CheckError(parsed);
  } else {
    KVPAGE_FUZZ_CHECK(std::isfinite(rate));
    KVPAGE_FUZZ_CHECK(fs.WasSet("compare") == compare);
    if (!fs.WasSet("block-size")) KVPAGE_FUZZ_CHECK(block_size == 16);
  }

  // Each argument is also a token count, and the whole input a comma-separated list.
  for (const std::string& arg : args) {
    int64_t v = -1;
    const absl::Status s = kvpage::cli::ParseTokenCount("context", arg, &v);
    if (s.ok()) {
      KVPAGE_FUZZ_CHECK(v >= 1 && v <= (int64_t{1} << 40));
    } else {
      kvpage::fuzz::CheckError(s);
      KVPAGE_FUZZ_CHECK(v == -1);  // untouched on error
    }
  }
  std::vector<int64_t> list;
  const absl::Status s = kvpage::cli::ParseTokenCountList("context", std::string(text), &list);
  if (s.ok()) {
    KVPAGE_FUZZ_CHECK(list.size() == static_cast<size_t>(std::count(text.begin(), text.end(), ',')) + 1);
    for (int64_t v : list) KVPAGE_FUZZ_CHECK(v >= 1 && v <= (int64_t{1} << 40));
  } else {
    kvpage::fuzz::CheckError(s);
  }
  return 0;
}
