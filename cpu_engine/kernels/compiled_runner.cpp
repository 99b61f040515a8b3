// The compiled decode step (an AOTInductor package, cpu_engine/compiled_step.py) run as an op of this library.
//
// torch's Python binding of the package loader holds the GIL for the whole run, ~7-35 ms a step; in the served
// `llm` model that stalled every other thread of the process (the one that sends responses, the ones that take
// requests in) for the length of each step, so responses and admissions came in bursts between steps. Called
// through torch.ops, the same run releases the GIL like any ATen op.
#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using torch::inductor::AOTIModelPackageLoader;

std::mutex packages_lock;
std::vector<std::unique_ptr<AOTIModelPackageLoader>> packages;  // by handle; packages stay loaded for the process

AOTIModelPackageLoader& package(int64_t handle) {
  std::lock_guard<std::mutex> guard(packages_lock);
  TORCH_CHECK(handle >= 0 && handle < static_cast<int64_t>(packages.size()), "compiled_run: no package ", handle);
  return *packages[handle];
}

int64_t compiled_open(const std::string& path) {
  auto loaded = std::make_unique<AOTIModelPackageLoader>(path, "model");
  std::lock_guard<std::mutex> guard(packages_lock);
  packages.push_back(std::move(loaded));
  return static_cast<int64_t>(packages.size()) - 1;
}

std::vector<std::string> compiled_constant_names(int64_t handle) { return package(handle).get_constant_fqns(); }

// The package's weights are the caller's tensors, used in place (the caller keeps them alive).
void compiled_set_constants(int64_t handle, const std::vector<std::string>& names,
                            const std::vector<at::Tensor>& values) {
  TORCH_CHECK(names.size() == values.size(), "compiled_set_constants: one tensor per name");
  std::unordered_map<std::string, at::Tensor> constants;
  for (size_t i = 0; i < names.size(); ++i) constants.emplace(names[i], values[i]);
  package(handle).load_constants(constants, /*use_inactive=*/false, /*check_full_update=*/true,
                                 /*user_managed=*/true);
}

std::vector<at::Tensor> compiled_run(int64_t handle, const std::vector<at::Tensor>& inputs) {
  return package(handle).run(inputs);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(llm_cpu, m) {
  m.def("compiled_open(str path) -> int", &compiled_open);
  m.def("compiled_constant_names(int handle) -> str[]", &compiled_constant_names);
  m.def("compiled_set_constants(int handle, str[] names, Tensor[] values) -> ()", &compiled_set_constants);
  m.def("compiled_run(int handle, Tensor[] inputs) -> Tensor[]", &compiled_run);
}
