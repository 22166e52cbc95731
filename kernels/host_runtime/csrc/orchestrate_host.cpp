/*
 * Entry points of the host runtime library for ctypes. The Cortex-M kernels are registered
 * through the Kernel table that ExecuTorch's codegen generates from
 * backends/cortex_m/ops/operators.yaml (RegisterKernels_0.cpp, built with
 * --manual-registration so that registration happens here, once, with its status returned
 * instead of aborting the process). EthosUBackend registers itself when the library is loaded,
 * from the static initializer in backends/arm/runtime/EthosUBackend.cpp.
 */
#include "RegisterKernels.h"

#include <cstring>

#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/span.h>
#include <executorch/runtime/kernel/operator_registry.h>

#define ORCHESTRATE_EXPORT extern "C" __attribute__((visibility("default")))

#ifndef ORCHESTRATE_BUILD_KEY
#define ORCHESTRATE_BUILD_KEY "unknown"
#endif

namespace {
bool g_registered = false;
int g_status = 0;
} // namespace

// 0 when the kernels are registered (now or by an earlier call); -1 when another library has
// already registered a kernel of the same name (registering again would abort the process);
// otherwise the executorch::runtime::Error the registry returned.
ORCHESTRATE_EXPORT int orchestrate_host_register_kernels(const char* probe_op) {
  if (g_registered) {
    return g_status;
  }
  if (probe_op != nullptr) {
    // Scanned rather than looked up: a lookup that misses logs an error.
    for (const auto& kernel : executorch::runtime::get_registered_kernels()) {
      if (std::strcmp(kernel.name_, probe_op) == 0) {
        return -1;
      }
    }
  }
  g_registered = true;
  g_status = static_cast<int>(torch::executor::register_all_kernels());
  return g_status;
}

ORCHESTRATE_EXPORT const char* orchestrate_host_build_key() {
  return ORCHESTRATE_BUILD_KEY;
}
