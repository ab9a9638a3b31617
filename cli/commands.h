// Subcommands of the `kvpage` CLI. Each returns the process exit code: 0 success,
// 1 runtime failure, 2 bad usage or bad input.
#ifndef KVPAGE_CLI_COMMANDS_H_
#define KVPAGE_CLI_COMMANDS_H_

#include <string>
#include <vector>

namespace kvpage::cli {

int RunPlan(const std::vector<std::string>& args);
int RunModels(const std::vector<std::string>& args);
int RunSim(const std::vector<std::string>& args);
int RunCost(const std::vector<std::string>& args);

// `kvpage plan --trace FILE --slo ...` (slo_plan_command.cc): whether args ask for it (they
// hold --slo or --trace), and the command itself.
bool IsSloPlan(const std::vector<std::string>& args);
int RunSloPlan(const std::vector<std::string>& args);

}  // namespace kvpage::cli

#endif  // KVPAGE_CLI_COMMANDS_H_
