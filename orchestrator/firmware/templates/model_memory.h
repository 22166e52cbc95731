/*
 * Where model.cpp finds the program and its buffers: defined by the generated model_memory.c
 * (each buffer in the section of the region the plan chose) and model_pte.S (the program image),
 * placed by the generated memory.ld.
 */
#ifndef ORCHESTRATE_MODEL_MEMORY_H
#define ORCHESTRATE_MODEL_MEMORY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

extern const uint8_t model_pte[];
extern const size_t model_pte_bytes;
extern uint8_t* const model_planned_buffers[];
extern const size_t model_planned_buffer_bytes[];
extern uint8_t model_method_pool[];
extern const size_t model_method_pool_bytes;
extern uint8_t model_temp_pool[];
extern const size_t model_temp_pool_bytes;
extern uint8_t model_weights_pool[];
extern const size_t model_weights_pool_bytes;  /* 0: the weights are read in place */
extern uint8_t model_npu_fast_scratch[];      /* the Ethos-U fast scratch (base address 2) */
extern const size_t model_npu_fast_scratch_bytes;

/* Programs with NPU partitions: set up the Ethos-U driver (npu_hardware.c on silicon,
 * npu_qemu_bridge.c on QEMU); 0 on success. */
int model_npu_setup(void);

#ifdef __cplusplus
}
#endif

#endif /* ORCHESTRATE_MODEL_MEMORY_H */
