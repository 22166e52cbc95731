/*
 * ExecuTorch's platform abstraction (runtime/platform/platform.h) for the runner: log lines on
 * the semihosting console in the format of the Arm executor runner, which platforms/fvp.py
 * parses (`I [executorch:file.cpp:123 function()] message`), SysTick ticks as the clock, and an
 * abort that ends the run with an exit code the harness recognises.
 */
#include <executorch/runtime/platform/platform.h>

#include <cstdio>
#include <cstring>

#include "board.h"

#ifndef RUNNER_CPU_HZ
#define RUNNER_CPU_HZ 32000000
#endif

void et_pal_init(void) {}

ET_NORETURN void et_pal_abort(void) {
  sh_print("F [executorch:pal.cpp] ExecuTorch aborted\n");
  sh_exit(RUNNER_EXIT_ABORT);
}

et_timestamp_t et_pal_current_ticks(void) {
  return counters_ticks();
}

et_tick_ratio_t et_pal_ticks_to_ns_multiplier(void) {
  // One SysTick tick is one CPU clock cycle: 1e9 / RUNNER_CPU_HZ ns, as a ratio.
  return {1000000000u / 1000u, RUNNER_CPU_HZ / 1000u};
}

void et_pal_emit_log_message(
    ET_UNUSED et_timestamp_t timestamp,
    et_pal_log_level_t level,
    const char* filename,
    const char* function,
    size_t line,
    const char* message,
    size_t length) {
  const char* base = std::strrchr(filename, '/');
  base = base != nullptr ? base + 1 : filename;
  char prefix[160];
  int prefix_length = std::snprintf(
      prefix, sizeof(prefix), "%c [executorch:%s:%lu %s()] ", static_cast<char>(level), base,
      static_cast<unsigned long>(line), function);
  if (prefix_length > 0) {
    sh_write(prefix, static_cast<size_t>(prefix_length) < sizeof(prefix)
                         ? static_cast<size_t>(prefix_length)
                         : sizeof(prefix) - 1);
  }
  while (length > 0 && (message[length - 1] == '\n' || message[length - 1] == '\r')) {
    length--;
  }
  sh_write(message, length);
  sh_write("\n", 1);
}

void* et_pal_allocate(ET_UNUSED size_t size) {
  return nullptr;
}

void et_pal_free(ET_UNUSED void* ptr) {}
