/*
 * The part of the Ethos-U core driver API (ethos-u-core-driver, ethosu_driver.h) that
 * ExecuTorch's backends/arm/runtime/EthosUBackend_Cortex_M.cpp calls, declared for a host build.
 * host_ethosu_driver.cpp implements it: instead of programming NPU registers, an invocation
 * hands the command stream and the base-address regions (weights, scratch, fast scratch) to a
 * callback, which computes the partition and writes its outputs into the scratch region where
 * the command stream would have left them.
 */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ethosu_driver;

struct ethosu_driver* ethosu_reserve_driver(void);
void ethosu_release_driver(struct ethosu_driver* drv);
int ethosu_invoke_v3(
    struct ethosu_driver* drv,
    const void* custom_data_ptr,
    const int custom_data_size,
    uint64_t* const base_addr,
    const size_t* base_addr_size,
    const int num_base_addr,
    void* user_arg);

#ifdef __cplusplus
}
#endif
