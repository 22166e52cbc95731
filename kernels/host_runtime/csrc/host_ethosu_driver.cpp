/*
 * A host stand-in for the Ethos-U core driver (see ethosu_driver.h). The NPU's work is done by
 * a callback that the Python side installs: it receives the command stream and every base
 * address region exactly as EthosUBackend_Cortex_M.cpp::platform_execute passes them to
 * ethosu_invoke_v3, reads the partition's inputs from the scratch region at the offsets Vela
 * assigned, and writes its outputs there. Everything around the invocation (the input copies
 * into the scratch, the dtype and element-count checks, the output copies and their layout
 * adjustment) is ExecuTorch's own EthosUBackend code, compiled unchanged.
 */
#include "ethosu_driver.h"

#include <executorch/runtime/platform/log.h>

#define ORCHESTRATE_EXPORT extern "C" __attribute__((visibility("default")))

// Returns 0 on success; anything else fails the invocation as a driver error would.
typedef int (*orchestrate_npu_invoke_fn)(
    const void* command_stream,
    size_t command_stream_bytes,
    const uint64_t* base_addresses,
    const size_t* base_address_bytes,
    int base_address_count);

namespace {
struct HostDriver {
  bool reserved = false;
};
HostDriver g_driver;
orchestrate_npu_invoke_fn g_npu_invoke = nullptr;
} // namespace

struct ethosu_driver {
  HostDriver* host;
};

namespace {
ethosu_driver g_handle{&g_driver};
} // namespace

ORCHESTRATE_EXPORT void orchestrate_host_set_npu_callback(
    orchestrate_npu_invoke_fn callback) {
  g_npu_invoke = callback;
}

extern "C" struct ethosu_driver* ethosu_reserve_driver(void) {
  // One NPU, one driver: a second reservation before the release fails, as on the device.
  if (g_driver.reserved) {
    return nullptr;
  }
  g_driver.reserved = true;
  return &g_handle;
}

extern "C" void ethosu_release_driver(struct ethosu_driver* drv) {
  if (drv != nullptr) {
    drv->host->reserved = false;
  }
}

extern "C" int ethosu_invoke_v3(
    struct ethosu_driver* drv,
    const void* custom_data_ptr,
    const int custom_data_size,
    uint64_t* const base_addr,
    const size_t* base_addr_size,
    const int num_base_addr,
    void* /*user_arg*/) {
  if (drv == nullptr || !drv->host->reserved) {
    ET_LOG(Error, "host Ethos-U driver: invoke without a reserved driver");
    return -1;
  }
  if (g_npu_invoke == nullptr) {
    ET_LOG(Error, "host Ethos-U driver: no NPU callback installed");
    return -1;
  }
  if (custom_data_ptr == nullptr || custom_data_size <= 0) {
    ET_LOG(Error, "host Ethos-U driver: empty command stream");
    return -1;
  }
  return g_npu_invoke(
      custom_data_ptr,
      static_cast<size_t>(custom_data_size),
      base_addr,
      base_addr_size,
      num_base_addr);
}
