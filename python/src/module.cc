// _kvpage: the C++ side of the kvpage Python package (python/kvpage/ wraps it).
#include <nanobind/nanobind.h>

#include "bindings.h"

NB_MODULE(_kvpage, m) {
  m.doc() = "kvpage's C++ library; import the `kvpage` package instead of this module.";
  kvpage::python::BindModel(m);
  kvpage::python::BindPlan(m);
  kvpage::python::BindSim(m);
  kvpage::python::BindStepOutput(m);
  kvpage::python::BindScheduler(m);
}
