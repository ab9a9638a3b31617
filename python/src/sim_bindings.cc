// `kvpage sim` (one server or a fleet) and `kvpage plan --slo` from Python: the CLI's flags,
// parsed by the CLI's own code (cli/library_entry.h), with the GIL released while they run.
// Each returns the JSON the CLI prints and, for simulations, the finished requests as NumPy
// arrays (kvpage/_sim.py and kvpage/_fleet.py wrap them).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "cli/library_entry.h"
#include "ndarray_util.h"
#include "status.h"

namespace nb = nanobind;

namespace kvpage::python {
namespace {

// One column per RequestRecord field (token_times_s left out), in trace order.
nb::dict RequestColumns(const std::vector<sim::RequestRecord>& records) {
  const size_t n = records.size();
  std::vector<int64_t> index(n), hit_tokens(n);
  std::vector<double> arrival(n), first_token(n), finish(n);
  std::vector<int32_t> prompt_len(n), output_len(n), preemptions(n);
  for (size_t i = 0; i < n; ++i) {
    const sim::RequestRecord& r = records[i];
    index[i] = r.index;
    arrival[i] = r.arrival_s;
    first_token[i] = r.first_token_s;
    finish[i] = r.finish_s;
    prompt_len[i] = r.prompt_len;
    output_len[i] = r.output_len;
    hit_tokens[i] = r.hit_tokens;
    preemptions[i] = r.num_preemptions;
  }
  nb::dict d;
  d["index"] = OwnedArray(std::move(index));
  d["arrival_s"] = OwnedArray(std::move(arrival));
  d["first_token_s"] = OwnedArray(std::move(first_token));
  d["finish_s"] = OwnedArray(std::move(finish));
  d["prompt_len"] = OwnedArray(std::move(prompt_len));
  d["output_len"] = OwnedArray(std::move(output_len));
  d["hit_tokens"] = OwnedArray(std::move(hit_tokens));
  d["num_preemptions"] = OwnedArray(std::move(preemptions));
  return d;
}

}  // namespace

void BindSim(nb::module_& m) {
  m.def(
      "_simulate",
      [](const std::vector<std::string>& args) {
        absl::StatusOr<cli::SimRun> run;
        {
          nb::gil_scoped_release release;
          run = cli::SimulateForArgs(args);
        }
        cli::SimRun value = ValueOrThrow(std::move(run));
        nb::list requests;
        for (const sim::SimResult& r : value.results) requests.append(RequestColumns(r.requests));
        return nb::make_tuple(value.json, value.allocators, requests);
      },
      nb::arg("args"),
      "(json, allocators, [per-run request columns]) of `kvpage sim ARGS --output-json -`.");
  m.def(
      "_simulate_fleet",
      [](const std::vector<std::string>& args) {
        absl::StatusOr<cli::FleetSimRun> run;
        {
          nb::gil_scoped_release release;
          run = cli::SimulateFleetForArgs(args);
        }
        cli::FleetSimRun value = ValueOrThrow(std::move(run));
        return nb::make_tuple(value.json, RequestColumns(value.result.requests));
      },
      nb::arg("args"),
      "(json, request columns) of `kvpage sim ARGS --output-json -` with --replicas.");
  m.def(
      "_plan_slo_json",
      [](const std::vector<std::string>& args) {
        absl::StatusOr<std::string> json;
        {
          nb::gil_scoped_release release;
          json = cli::SloPlanJsonForArgs(args);
        }
        return ValueOrThrow(std::move(json));
      },
      nb::arg("args"), "The JSON `kvpage plan --trace --slo ARGS --format json` prints.");
}

}  // namespace kvpage::python
