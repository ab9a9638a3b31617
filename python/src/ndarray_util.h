// NumPy arrays that own a std::vector moved into them (freed with the array).
#ifndef KVPAGE_PYTHON_NDARRAY_UTIL_H_
#define KVPAGE_PYTHON_NDARRAY_UTIL_H_

#include <cstddef>
#include <utility>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

namespace kvpage::python {

template <typename T>
nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<1>> OwnedArray(std::vector<T> values) {
  auto* heap = new std::vector<T>(std::move(values));
  nanobind::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<1>>(heap->data(), {heap->size()},
                                                                  owner);
}

}  // namespace kvpage::python

#endif  // KVPAGE_PYTHON_NDARRAY_UTIL_H_
