// The model layer alone: the bundled catalog must list every model (not an empty list, which
// a wrong source path inside a parent project used to give). Prints "consumer_model ok".
#include <cstdio>

#include "kvpage/catalog.h"

int main() {
  const size_t models = kvpage::BundledModelNames().size();
  const size_t gpus = kvpage::BundledGpuNames().size();
  if (models < 10 || gpus < 3) {
    std::fprintf(stderr, "consumer_model: %zu bundled models and %zu GPUs\n", models, gpus);
    return 1;
  }
  absl::StatusOr<kvpage::ModelSpec> model = kvpage::LoadModel("gemma-3-4b-it");
  if (!model.ok()) {
    std::fprintf(stderr, "consumer_model: %s\n", model.status().ToString().c_str());
    return 1;
  }
  std::printf("consumer_model ok: %zu models, %zu GPUs\n", models, gpus);
  return 0;
}
