/*
 * The Ethos-U on silicon (or an FVP) for an `orchestrate firmware` project with NPU partitions:
 * one driver for the one NPU at the platform's register address, its interrupt wired into the
 * vector table after the system exceptions, and the fast scratch ExecuTorch's EthosUBackend
 * hands to the driver. The addresses and the interrupt number come from the platform's
 * runner/firmware.yaml (npu: base_address, irq) through model_io.h.
 *
 * On QEMU, which models no Ethos-U, the project links board/npu/ethosu_bridge.c instead (the
 * runner's semihosting bridge to the host's functional model); see docs/firmware.md.
 */
#include <stddef.h>
#include <stdint.h>

#include "ethosu_driver.h"
#include "model_io.h"
#include "model_memory.h"

#define NVIC_ISER ((volatile uint32_t*)0xE000E100u)

unsigned char* ethosu_fast_scratch = NULL;
size_t ethosu_fast_scratch_size = 0;

static struct ethosu_driver model_npu_driver;

static void model_npu_irq(void) {
  ethosu_irq_handler(&model_npu_driver);
}

/* The external interrupts up to and including the NPU's, right after startup.c's 16 system
 * vectors (memory.ld keeps .vectors.irq behind .vectors). */
typedef void (*vector_t)(void);
extern void Default_Handler(void);
__attribute__((section(".vectors.irq"), used)) const vector_t model_irq_vectors[MODEL_NPU_IRQ + 1] = {
    [0 ... MODEL_NPU_IRQ] = Default_Handler,
    [MODEL_NPU_IRQ] = model_npu_irq,
};

int model_npu_setup(void) {
  ethosu_fast_scratch = model_npu_fast_scratch_bytes ? model_npu_fast_scratch : NULL;
  ethosu_fast_scratch_size = model_npu_fast_scratch_bytes;
  if (ethosu_init(&model_npu_driver, (void*)(uintptr_t)MODEL_NPU_BASE_ADDRESS,
                  ethosu_fast_scratch, ethosu_fast_scratch_size, 1, 1) != 0) {
    return -1;
  }
  NVIC_ISER[MODEL_NPU_IRQ / 32] = 1u << (MODEL_NPU_IRQ % 32);
  return 0;
}
