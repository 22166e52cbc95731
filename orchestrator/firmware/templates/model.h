/*
 * The model's C API, generated into every `orchestrate firmware` project (orchestrator/firmware/templates/).
 *
 *   model_init() once: loads the program embedded in the firmware and its method, with every
 *   buffer in the memory region the plan chose (model_memory.c, memory.ld).
 *   model_run(inputs, outputs): copies each input in, runs one inference, copies each output out.
 *   model_reset(): for a program with state (MODEL_STATE_BYTES > 0, a streaming model whose
 *   state carries from one model_run to the next), start the state again from its initial
 *   values, as at model_init: where a new stream begins.
 *
 * The shapes, element types, byte layouts (dim order), int8 scales and zero points of the
 * inputs and outputs are in model_io.h.
 */
#ifndef ORCHESTRATE_MODEL_H
#define ORCHESTRATE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model_io.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  MODEL_OK = 0,
  MODEL_ERROR_PROGRAM = 1,   /* the embedded .pte did not load (damaged, or another version) */
  MODEL_ERROR_METHOD = 2,    /* the method did not load: a pool too small, a missing kernel */
  MODEL_ERROR_IO = 3,        /* an input or output does not match model_io.h */
  MODEL_ERROR_RUN = 4,       /* a kernel failed during the inference */
  MODEL_ERROR_NOT_INIT = 5,  /* model_run before a successful model_init */
  MODEL_ERROR_NPU = 6,       /* the Ethos-U driver did not initialise */
} model_status_t;

/* Load the program and its method. Call once before model_run. */
model_status_t model_init(void);

/* One inference. inputs[i] holds MODEL_INPUT<i>_BYTES bytes laid out in MODEL_INPUT<i>_DIM_ORDER;
 * outputs[i] receives MODEL_OUTPUT<i>_BYTES bytes laid out in MODEL_OUTPUT<i>_DIM_ORDER. */
model_status_t model_run(const void* const inputs[MODEL_INPUT_COUNT],
                         void* const outputs[MODEL_OUTPUT_COUNT]);

/* Start the program's state again from its initial values (reloads the method; the program
 * stays loaded). Without state, a model_run after it computes what it computed before. */
model_status_t model_reset(void);

/* Bytes of the method pool the loaded method took (compare with MODEL_METHOD_POOL_BYTES). */
size_t model_method_pool_used(void);

#ifdef __cplusplus
}
#endif

#endif /* ORCHESTRATE_MODEL_H */
