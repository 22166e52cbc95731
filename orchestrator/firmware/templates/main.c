/*
 * An example main for an `orchestrate firmware` project: run the model on each of the
 * EXAMPLE_FRAMES example inputs in turn (example_io.h, generated) and print, per frame, each
 * output's bytes in hex on the semihosting console and the inference's SysTick ticks; then the
 * stack's high-water mark, and exit with the model's status. A program with state
 * (MODEL_STATE_BYTES > 0, a streaming model) carries it from frame to frame; after the frames,
 * model_reset() starts it again and the first frame runs once more ("reset_frame: 0"), which
 * must give the first frame's bytes.
 *
 * A product replaces this file: call model_init() once and model_run() per inference (per frame)
 * from its own code, and model_reset() where a new stream starts. On QEMU
 * (`-semihosting-config enable=on`) or an FVP the console is the host's stdout.
 */
#include <stdint.h>

#include "board.h"
#include "example_io.h"
#include "model.h"

extern uint32_t __stack_limit[];

#define STACK_PAINT 0xA5u

static void print_unsigned(const char* name, uint32_t value) {
  char digits[11];
  int n = 0;
  do {
    digits[n++] = (char)('0' + value % 10u);
    value /= 10u;
  } while (value != 0u);
  sh_print(name);
  while (n > 0) {
    sh_write(&digits[--n], 1);
  }
  sh_print("\n");
}

static void print_hex_bytes(const uint8_t* bytes, size_t count) {
  static const char hex[] = "0123456789abcdef";
  char pair[2];
  for (size_t i = 0; i < count; i++) {
    pair[0] = hex[bytes[i] >> 4];
    pair[1] = hex[bytes[i] & 0xFu];
    sh_write(pair, 2);
  }
}

/* Fill the unused stack below the current frame with a pattern; stack_used() finds the lowest
 * byte the pattern lost. */
static void paint_stack(void) {
  volatile uint8_t here = 0;
  uint8_t* p = (uint8_t*)__stack_limit;
  uint8_t* end = (uint8_t*)&here - 256;
  while (p < end) {
    *p++ = STACK_PAINT;
  }
}

static uint32_t stack_used(const uint8_t* top) {
  const uint8_t* p = (const uint8_t*)__stack_limit;
  while (p < top && *p == STACK_PAINT) {
    p++;
  }
  return (uint32_t)(top - p);
}

extern uint32_t __stack_top[];

/* One inference on example frame `frame`: its status, ticks and outputs on the console. */
static model_status_t run_frame(const char* marker, unsigned frame) {
  const void* inputs[MODEL_INPUT_COUNT];
  for (unsigned i = 0; i < MODEL_INPUT_COUNT; i++) {
    inputs[i] = example_input_frames[i] + (size_t)frame * example_input_bytes[i];
  }
  print_unsigned(marker, frame);
  const uint64_t before = counters_ticks();
  const model_status_t status = model_run(inputs, example_outputs);
  const uint64_t ticks = counters_ticks() - before;
  print_unsigned("model_run: ", (uint32_t)status);
  if (status != MODEL_OK) {
    return status;
  }
  print_unsigned("inference_systick_ticks: ", (uint32_t)ticks);
  for (unsigned i = 0; i < MODEL_OUTPUT_COUNT; i++) {
    print_unsigned("output: ", i);
    print_hex_bytes((const uint8_t*)example_outputs[i], example_output_bytes[i]);
    sh_print("\n");
  }
  return MODEL_OK;
}

int main(void) {
  paint_stack();
  model_status_t status = model_init();
  print_unsigned("model_init: ", (uint32_t)status);
  if (status != MODEL_OK) {
    return (int)status + 20;
  }
  print_unsigned("method_pool_used_bytes: ", (uint32_t)model_method_pool_used());
  for (unsigned frame = 0; frame < EXAMPLE_FRAMES; frame++) {
    status = run_frame("frame: ", frame);
    if (status != MODEL_OK) {
      return (int)status + 20;
    }
  }
#if MODEL_STATE_BYTES > 0 && EXAMPLE_FRAMES > 1
  status = model_reset();
  print_unsigned("model_reset: ", (uint32_t)status);
  if (status != MODEL_OK) {
    return (int)status + 20;
  }
  status = run_frame("reset_frame: ", 0);
  if (status != MODEL_OK) {
    return (int)status + 20;
  }
#endif
  print_unsigned("stack_used_bytes: ", stack_used((const uint8_t*)__stack_top));
  return 0;
}
