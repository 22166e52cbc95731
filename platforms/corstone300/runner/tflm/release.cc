/*
 * The incumbent's release firmware: what a team ships with TensorFlow Lite Micro, built to be
 * measured beside an `orchestrate firmware` release project (kernels/native/tflm_release.py).
 * The model is linked into flash (tflm_model.S, section .rodata.model_tflite), the tensor arena
 * is a static buffer of the size TFLM itself reported for this model, and main() does what the
 * firmware project's example main does: set up the NPU, load the model, allocate, run one
 * inference, print each output's bytes in hex on the semihosting console with the inference's
 * SysTick ticks and the stack's high-water mark, and exit with the status.
 *
 * Built with TFLM's release defines (NDEBUG, TF_LITE_STRIP_ERROR_STRINGS: no log strings), the
 * same core flags, link-time optimization and newlib-nano as the firmware project. With an NPU,
 * the Ethos-U core driver is linked with its own device layer for silicon (the registers at
 * TFLM_RELEASE_NPU_BASE, the interrupt TFLM_RELEASE_NPU_IRQ), as the project's is.
 */
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "board.h"
#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/micro/micro_time.h"
#include "tensorflow/lite/schema/schema_generated.h"
// Generated (kernels/native/tflm.py, tflm_release.py): the model's operators, the arena's size
// and the NPU's address, interrupt and fast scratch.
#include "tflm_operators.h"
#include "tflm_release.h"

#if TFLM_RELEASE_NPU
#include "ethosu_driver.h"
#endif

extern "C" const uint8_t tflm_model[];  // tflm_model.S
extern "C" uint32_t __stack_limit[];
extern "C" uint32_t __stack_top[];

namespace {

constexpr uint8_t kStackPaint = 0xA5u;

alignas(16) uint8_t tensor_arena[TFLM_RELEASE_ARENA_BYTES];

void print_unsigned(const char* name, uint32_t value) {
  char digits[11];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10u);
    value /= 10u;
  } while (value != 0u);
  sh_print(name);
  while (n > 0) {
    sh_write(&digits[--n], 1);
  }
  sh_print("\n");
}

void print_hex_bytes(const uint8_t* bytes, size_t count) {
  static const char hex[] = "0123456789abcdef";
  char pair[2];
  for (size_t i = 0; i < count; i++) {
    pair[0] = hex[bytes[i] >> 4];
    pair[1] = hex[bytes[i] & 0xFu];
    sh_write(pair, 2);
  }
}

// Fill the unused stack below the current frame; stack_used() finds the lowest byte it lost.
void paint_stack() {
  volatile uint8_t here = 0;
  uint8_t* p = reinterpret_cast<uint8_t*>(__stack_limit);
  uint8_t* end = const_cast<uint8_t*>(&here) - 256;
  while (p < end) {
    *p++ = kStackPaint;
  }
}

uint32_t stack_used() {
  const uint8_t* top = reinterpret_cast<const uint8_t*>(__stack_top);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(__stack_limit);
  while (p < top && *p == kStackPaint) {
    p++;
  }
  return static_cast<uint32_t>(top - p);
}

#if TFLM_RELEASE_NPU
#if TFLM_RELEASE_FAST_SCRATCH_BYTES > 0
alignas(16) uint8_t npu_fast_scratch[TFLM_RELEASE_FAST_SCRATCH_BYTES];
#endif
ethosu_driver npu_driver;

void npu_irq() { ethosu_irq_handler(&npu_driver); }

int npu_setup() {
#if TFLM_RELEASE_FAST_SCRATCH_BYTES > 0
  void* fast = npu_fast_scratch;
#else
  void* fast = nullptr;
#endif
  if (ethosu_init(&npu_driver, reinterpret_cast<void*>(TFLM_RELEASE_NPU_BASE), fast,
                  TFLM_RELEASE_FAST_SCRATCH_BYTES, 1, 1) != 0) {
    return -1;
  }
  volatile uint32_t* iser = reinterpret_cast<volatile uint32_t*>(0xE000E100u);
  iser[TFLM_RELEASE_NPU_IRQ / 32] = 1u << (TFLM_RELEASE_NPU_IRQ % 32);
  return 0;
}
#endif

}  // namespace

#if TFLM_RELEASE_NPU
// The external interrupts up to and including the NPU's, after startup.c's 16 system vectors
// (the linker script keeps .vectors.irq behind .vectors).
extern "C" void Default_Handler(void);
namespace {
typedef void (*vector_t)(void);
struct IrqVectors {
  vector_t vectors[TFLM_RELEASE_NPU_IRQ + 1];
};
constexpr IrqVectors irq_vectors() {
  IrqVectors table{};
  for (int i = 0; i < TFLM_RELEASE_NPU_IRQ; i++) {
    table.vectors[i] = Default_Handler;
  }
  table.vectors[TFLM_RELEASE_NPU_IRQ] = npu_irq;
  return table;
}
}  // namespace
__attribute__((section(".vectors.irq"), used)) const IrqVectors tflm_irq_vectors = irq_vectors();
#endif

// The board's clock for TFLM (a target port provides micro_time.cc).
namespace tflite {
uint32_t ticks_per_second() { return RUNNER_CPU_HZ; }
uint32_t GetCurrentTimeTicks() { return static_cast<uint32_t>(counters_ticks()); }
}  // namespace tflite

int main(void) {
  paint_stack();
#if TFLM_RELEASE_NPU
  if (npu_setup() != 0) {
    return 21;
  }
#endif
  const tflite::Model* model = tflite::GetModel(tflm_model);
  if (model->version() != TFLITE_SCHEMA_VERSION) {
    return 22;
  }
  static tflite::MicroMutableOpResolver<TFLM_OPERATOR_COUNT> resolver;
  if (!(TFLM_REGISTER_OPERATORS(resolver))) {
    return 23;
  }
  alignas(tflite::MicroInterpreter) static uint8_t storage[sizeof(tflite::MicroInterpreter)];
  tflite::MicroInterpreter* interpreter =
      new (storage) tflite::MicroInterpreter(model, resolver, tensor_arena, sizeof(tensor_arena));
  const TfLiteStatus allocated = interpreter->AllocateTensors();
  print_unsigned("allocate_tensors: ", static_cast<uint32_t>(allocated));
  if (allocated != kTfLiteOk) {
    return 24;
  }
  print_unsigned("arena_used_bytes: ", static_cast<uint32_t>(interpreter->arena_used_bytes()));
  for (size_t i = 0; i < interpreter->inputs_size(); i++) {
    TfLiteTensor* input = interpreter->input(i);
    memset(input->data.raw, 0, input->bytes);
  }
  const uint64_t before = counters_ticks();
  const TfLiteStatus status = interpreter->Invoke();
  const uint64_t ticks = counters_ticks() - before;
  print_unsigned("invoke: ", static_cast<uint32_t>(status));
  if (status != kTfLiteOk) {
    return 25;
  }
  print_unsigned("inference_systick_ticks: ", static_cast<uint32_t>(ticks));
  for (size_t i = 0; i < interpreter->outputs_size(); i++) {
    const TfLiteTensor* output = interpreter->output(i);
    print_unsigned("output: ", static_cast<uint32_t>(i));
    print_hex_bytes(reinterpret_cast<const uint8_t*>(output->data.raw), output->bytes);
    sh_print("\n");
  }
  print_unsigned("stack_used_bytes: ", stack_used());
  return 0;
}
