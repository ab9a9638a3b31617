// Model specs and the bundled catalogs.
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "absl/strings/match.h"
#include "bindings.h"
#include "kvpage/catalog.h"
#include "kvpage/model_spec.h"
#include "status.h"

namespace nb = nanobind;

namespace kvpage::python {
namespace {

// What `--model` of the CLI takes to load this spec again: the bundled name or the path.
std::string CliName(const ModelSpec& m) {
  constexpr absl::string_view kBundled = "bundled:";
  if (absl::StartsWith(m.source, kBundled)) return m.source.substr(kBundled.size());
  return m.source;
}

nb::list Groups(const ModelSpec& m) {
  nb::list groups;
  for (const LayerGroup& g : m.groups) {
    nb::dict d;
    d["kind"] = std::string(LayerKindName(g.spec.kind));
    d["layers"] = g.layers;
    if (g.spec.IsAttention()) {
      d["num_kv_heads"] = g.spec.attention.num_kv_heads;
      d["head_dim_k"] = g.spec.attention.head_dim_k;
      d["head_dim_v"] = g.spec.attention.head_dim_v;
      d["sliding_window"] = g.spec.sliding_window;
      d["attention_chunk_size"] = g.spec.attention_chunk_size;
    } else {
      d["conv_values"] = g.spec.linear.ConvValues();
      d["recurrent_values"] = g.spec.linear.RecurrentValues();
    }
    groups.append(d);
  }
  return groups;
}

}  // namespace

void BindModel(nb::module_& m) {
  nb::class_<ModelSpec>(m, "Model",
                        "A model's layers as kvpage sees them (kvpage::ModelSpec). Immutable; "
                        "made by load_model().")
      .def_ro("name", &ModelSpec::name)
      .def_ro("source", &ModelSpec::source, "'bundled:NAME' or the config.json's path")
      .def_prop_ro("cli_name", &CliName, "what `kvpage --model` takes to load this model")
      .def_ro("model_type", &ModelSpec::model_type)
      .def_prop_ro("dtype", [](const ModelSpec& s) { return std::string(DTypeName(s.dtype)); })
      .def_ro("max_position_embeddings", &ModelSpec::max_position_embeddings)
      .def_ro("hidden_size", &ModelSpec::hidden_size)
      .def_ro("num_attention_heads", &ModelSpec::num_attention_heads)
      .def_ro("vocab_size", &ModelSpec::vocab_size)
      .def_ro("num_params", &ModelSpec::num_params)
      .def_ro("weight_bytes", &ModelSpec::weight_bytes)
      .def_prop_ro("num_layers", &ModelSpec::num_layers)
      .def_prop_ro("groups", &Groups,
                   "one dict per layer group: kind, layers, and its cache shape")
      .def("__repr__", [](const ModelSpec& s) {
        return "kvpage.Model('" + s.name + "', " + std::to_string(s.num_layers()) + " layers)";
      });

  m.def(
      "load_model",
      [](const std::string& name_or_path) { return ValueOrThrow(LoadModel(name_or_path)); },
      nb::arg("name_or_path"),
      "A bundled model by name, or a Hugging Face config.json by path. KeyError (listing the "
      "bundled names) when it is neither; ValueError for a malformed config.");
  m.def("bundled_models", &BundledModelNames, "names of the bundled model configs, sorted");
  m.def("bundled_gpus", &BundledGpuAliases, "short names of the bundled GPUs, sorted");
}

}  // namespace kvpage::python
