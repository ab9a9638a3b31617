// What `kvpage sim` shows and writes: the progress bar, the summary tables of single runs and
// of a fleet, the JSON of several runs, and the output directory (CSV files and the plot).
#ifndef KVPAGE_CLI_SIM_REPORT_H_
#define KVPAGE_CLI_SIM_REPORT_H_

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "sim/cost_model_summary.h"
#include "sim/fleet.h"
#include "sim/simulator.h"

namespace kvpage::cli {

// A progress bar on stderr, drawn only when stderr is a terminal and the run has taken more
// than a second.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar() { Clear(); }
  // Erases the bar so that later messages start on a clean line.
  void Clear();
  void Update(const sim::SimProgress& p);

 private:
  std::string label_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

// One column per run (named by the pair's first): the numbers a reader compares first.
std::string SummaryTable(const std::vector<std::pair<std::string, const sim::SimResult*>>& runs);

// The fleet's numbers, then one row per replica.
std::string FleetTable(const sim::FleetResult& r);

// One run's JSON, or {"kvpage": {...}, "vllm": {...}} for several; each with `cost`.
std::string ResultsJson(const std::vector<std::string>& allocators,
                        const std::vector<sim::SimResult>& results,
                        const sim::CostModelSummary& cost);

// Writes requests.csv, steps.csv and sim.png (the plot script) in `dir`, which it creates.
// Returns 0, or 1 after a message on stderr.
int WriteOutputDir(const sim::SimResult& r, const std::string& dir, const std::string& title);

}  // namespace kvpage::cli

#endif  // KVPAGE_CLI_SIM_REPORT_H_
