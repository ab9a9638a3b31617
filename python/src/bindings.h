// The parts of the _kvpage module, one function per file (module.cc calls them in order).
#ifndef KVPAGE_PYTHON_BINDINGS_H_
#define KVPAGE_PYTHON_BINDINGS_H_

#include <nanobind/nanobind.h>

namespace kvpage::python {

void BindModel(nanobind::module_& m);      // ModelSpec, load_model, the catalogs
void BindPlan(nanobind::module_& m);       // `kvpage plan` as _plan_json
void BindSim(nanobind::module_& m);        // `kvpage sim` as _simulate
void BindStepOutput(nanobind::module_& m);  // StepOutput (step_views.cc)
void BindScheduler(nanobind::module_& m);   // Scheduler, Request, FinishedRequest

}  // namespace kvpage::python

#endif  // KVPAGE_PYTHON_BINDINGS_H_
