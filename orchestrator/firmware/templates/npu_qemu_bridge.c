/*
 * The Ethos-U for an `orchestrate firmware` project run on QEMU (`--npu-device qemu-bridge`):
 * the runner's device layer (board/npu/ethosu_bridge.c) hands each command stream the real
 * Ethos-U core driver starts to the host's functional model over semihosting.
 */
#include <stddef.h>
#include <stdint.h>

#include "board.h"
#include "model_memory.h"

int model_npu_setup(void) {
  return runner_npu_setup(model_npu_fast_scratch_bytes ? model_npu_fast_scratch : NULL,
                          model_npu_fast_scratch_bytes);
}
