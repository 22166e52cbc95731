/*
 * ExecuTorch's platform layer for the release profile: no log output (the runtime is built with
 * ET_LOG_ENABLED=0, so nothing calls et_pal_emit_log_message), SysTick ticks as the clock, and
 * an abort that ends the program with the board's abort code. Replace board_abort in board.h's
 * board support to reset or halt instead.
 */
#include <executorch/runtime/platform/platform.h>

#include "board.h"

#ifndef RUNNER_CPU_HZ
#define RUNNER_CPU_HZ 32000000
#endif

void et_pal_init(void) {}

ET_NORETURN void et_pal_abort(void) {
  sh_exit(RUNNER_EXIT_ABORT);
}

et_timestamp_t et_pal_current_ticks(void) {
  return counters_ticks();
}

et_tick_ratio_t et_pal_ticks_to_ns_multiplier(void) {
  return {1000000000u / 1000u, RUNNER_CPU_HZ / 1000u};
}

void et_pal_emit_log_message(ET_UNUSED et_timestamp_t timestamp,
                             ET_UNUSED et_pal_log_level_t level,
                             ET_UNUSED const char* filename, ET_UNUSED const char* function,
                             ET_UNUSED size_t line, ET_UNUSED const char* message,
                             ET_UNUSED size_t length) {}

void* et_pal_allocate(ET_UNUSED size_t size) {
  return nullptr;
}

void et_pal_free(ET_UNUSED void* ptr) {}

// The C library's abort and assert would pull in signal handling and fprintf (about 4 KiB on
// newlib-nano); the firmware has neither to report to, so both end the program like
// et_pal_abort.
extern "C" ET_NORETURN void abort(void) {
  sh_exit(RUNNER_EXIT_ABORT);
}

extern "C" ET_NORETURN void __assert_func(const char*, int, const char*, const char*) {
  sh_exit(RUNNER_EXIT_ABORT);
}
