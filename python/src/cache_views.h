// The Scheduler's views of the cache kvpage owns (backing='host'): every layer's K and V (or
// MLA latent, or linear-attention states) as NumPy arrays over the host backing's memory, no
// copies, and as DLPack exports with the cache's own dtype (torch.from_dlpack).
//
// Lifetime: a view keeps its Scheduler, and so the memory, alive; close() raises while one is
// referenced, and every call raises after close(). The memory behind a block holds a
// request's K/V while the block table lists it; a chunk the manager has not mapped (or gave
// back) reads as zeros (readable_backing.h).
#ifndef KVPAGE_PYTHON_CACHE_VIEWS_H_
#define KVPAGE_PYTHON_CACHE_VIEWS_H_

#include <nanobind/nanobind.h>

#include "step_views.h"

namespace kvpage::python {

// Adds cache(), cache_tensors and close() to the Scheduler class.
void DefCacheViews(nanobind::class_<PyScheduler>& cls);

}  // namespace kvpage::python

#endif  // KVPAGE_PYTHON_CACHE_VIEWS_H_
