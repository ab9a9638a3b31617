// Runs the built `kvpage` CLI from a test and captures what it printed and its exit status.
#ifndef KVPAGE_TESTS_TESTING_RUN_KVPAGE_H_
#define KVPAGE_TESTS_TESTING_RUN_KVPAGE_H_

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace kvpage::testing {

struct CommandResult {
  int exit_code = -1;  // WEXITSTATUS, or -1 when the process did not exit normally
  std::string output;  // stdout and stderr, interleaved
};

// Runs `env kvpage ARGS` (shell text; `env` assignments such as "KVPAGE_DATA_DIR=/x ").
inline CommandResult RunKvpage(const std::string& args, const std::string& env = "") {
  const std::string command =
      env + std::string(KVPAGE_BINARY_DIR) + "/bin/kvpage " + args + " 2>&1";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    ADD_FAILURE() << "popen failed: " << command;
    return result;
  }
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != -1 && WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

}  // namespace kvpage::testing

#endif  // KVPAGE_TESTS_TESTING_RUN_KVPAGE_H_
