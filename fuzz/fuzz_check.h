// What the harnesses share: a check that aborts with a message (libFuzzer and the replay
// test both report an abort as a failing input), and the rule every reader must keep: an
// error is a Status with a message, never an empty one.
#ifndef KVPAGE_FUZZ_FUZZ_CHECK_H_
#define KVPAGE_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

#define KVPAGE_FUZZ_CHECK(cond)                                                      \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                  \
    }                                                                                \
  } while (false)

namespace kvpage::fuzz {

// A rejected input must say why.
inline void CheckError(const absl::Status& s) {
  KVPAGE_FUZZ_CHECK(!s.ok());
  KVPAGE_FUZZ_CHECK(!s.message().empty());
}

}  // namespace kvpage::fuzz

#endif  // KVPAGE_FUZZ_FUZZ_CHECK_H_
