// `kvpage plan` from Python: the CLI's flags, parsed by the CLI's own code (PlansForArgs), so
// a plan made here equals the one `kvpage plan --format json` prints for the same flags. The
// Python layer (kvpage/_plan.py) turns keyword arguments into those flags and the JSON into
// frozen objects.
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "cli/library_entry.h"
#include "kvpage/plan_format.h"
#include "status.h"

namespace nb = nanobind;

namespace kvpage::python {

void BindPlan(nb::module_& m) {
  m.def(
      "_plan_json",
      [](const std::vector<std::string>& args) {
        absl::StatusOr<std::vector<Plan>> plans;
        {
          nb::gil_scoped_release release;  // a long context list runs the manager's dry run
          plans = cli::PlansForArgs(args);
        }
        const std::vector<Plan>& value = ValueOrThrow(std::move(plans));
        nb::list out;
        for (const Plan& plan : value) out.append(PlansToJson({&plan, 1}));
        return out;
      },
      nb::arg("args"),
      "One JSON document per plan `kvpage plan ARGS --format json` makes.");
}

}  // namespace kvpage::python
