/*
 * The Ethos-U core driver's semaphores without a heap: its bare-metal defaults (ethosu_driver.c,
 * weak) take them from malloc, and an `orchestrate firmware` project has no heap. The same
 * behaviour on static storage: take waits for an event (WFE) until the count is non-zero, give
 * (from the NPU's interrupt) counts and signals (SEV). The driver creates two: its global one and
 * one per driver.
 */
#include <stddef.h>
#include <stdint.h>

#define MODEL_NPU_SEMAPHORES 4

struct model_npu_semaphore {
  volatile uint32_t count;
};

static struct model_npu_semaphore semaphores[MODEL_NPU_SEMAPHORES];
static unsigned semaphores_used;

void* ethosu_semaphore_create(void) {
  if (semaphores_used >= MODEL_NPU_SEMAPHORES) {
    return NULL;
  }
  struct model_npu_semaphore* semaphore = &semaphores[semaphores_used++];
  semaphore->count = 0;
  return semaphore;
}

void ethosu_semaphore_destroy(void* semaphore) {
  (void)semaphore;
}

int ethosu_semaphore_take(void* semaphore, uint64_t timeout) {
  (void)timeout;
  struct model_npu_semaphore* s = (struct model_npu_semaphore*)semaphore;
  while (s->count == 0) {
    __asm volatile("wfe");
  }
  s->count--;
  return 0;
}

int ethosu_semaphore_give(void* semaphore) {
  ((struct model_npu_semaphore*)semaphore)->count++;
  __asm volatile("sev");
  return 0;
}
