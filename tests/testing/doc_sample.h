// Checks that a doc shows a test's sample code exactly (tests/, internal).
#ifndef KVPAGE_TESTS_TESTING_DOC_SAMPLE_H_
#define KVPAGE_TESTS_TESTING_DOC_SAMPLE_H_

#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvpage::testing {

inline std::string ReadSourceFile(const std::string& relative_path) {
  std::ifstream in(std::string(KVPAGE_SOURCE_DIR) + "/" + relative_path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// OK when `doc` (a path under the source tree) holds, as a ```cpp block, the lines of `test`
// between the lines "  // [marker]" and "  // [marker end]", two spaces less indented.
inline absl::Status DocShowsSample(const std::string& doc, const std::string& test,
                                   const std::string& marker) {
  const std::string self = ReadSourceFile(test);
  const std::string begin = "  // [" + marker + "]\n", end = "  // [" + marker + " end]\n";
  const size_t b = self.find(begin), e = self.find(end);
  if (b == std::string::npos || e == std::string::npos) {
    return absl::NotFoundError(absl::StrCat(test, " has no [", marker, "] markers"));
  }
  std::stringstream lines(self.substr(b + begin.size(), e - b - begin.size()));
  std::string line, sample;
  while (std::getline(lines, line)) sample += (line.rfind("  ", 0) == 0 ? line.substr(2) : line) + "\n";
  if (ReadSourceFile(doc).find("```cpp\n" + sample + "```") == std::string::npos) {
    return absl::NotFoundError(absl::StrCat(doc, " must show this sample exactly:\n", sample));
  }
  return absl::OkStatus();
}

}  // namespace kvpage::testing

#endif  // KVPAGE_TESTS_TESTING_DOC_SAMPLE_H_
