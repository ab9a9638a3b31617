// kvpage: capacity planning and trace simulation from the command line.
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace {

constexpr const char* kUsage = R"(kvpage — paged KV cache toolkit

Usage:
  kvpage plan   --model M --context L[,L…] [--policy P | --compare] [flags]
                How much KV memory one request of length L reserves, under kvpage,
                vLLM or llama.cpp, and how many fit on a GPU.
  kvpage sim    --model M --gpu G --trace FILE [--compare-allocators] [flags]
                Replays a request trace through the scheduler and block manager on a
                simulated GPU: TTFT, TPOT, throughput, preemptions, prefix hits, KV usage.
  kvpage cost   --model M --gpu G --batch CTX:NEW[,CTX:NEW…] [--format json]
                The predicted time of one forward step and its terms (the model
                `kvpage sim` uses).
  kvpage models [--model M]
                The bundled model configs and their layer groups.

Run `kvpage COMMAND --help` for the flags of a command.
)";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << kUsage;
    return 2;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "plan") return kvpage::cli::RunPlan(args);
  if (command == "models") return kvpage::cli::RunModels(args);
  if (command == "sim") return kvpage::cli::RunSim(args);
  if (command == "cost") return kvpage::cli::RunCost(args);
  if (command == "-h" || command == "--help" || command == "help") {
    std::cout << kUsage;
    return 0;
  }
  std::cerr << "kvpage: unknown command '" << command << "'\n\n" << kUsage;
  return 2;
}
