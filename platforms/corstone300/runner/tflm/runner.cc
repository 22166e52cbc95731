/*
 * The incumbent's runner: a `.tflite` file (plain, or compiled by Vela with its `ethos-u` custom
 * operators) run by TensorFlow Lite Micro with its CMSIS-NN kernels, on the same board support as
 * the ExecuTorch runner (startup.c, semihosting.c, counters.c one folder up) and, for the NPU
 * build, TFLM's Ethos-U kernel calling the same Ethos-U core driver over the same semihosting
 * bridge (../npu/ethosu_bridge.c).
 *
 * The harness (platforms/qemu_tflm.py) writes the mailbox (tflm_mailbox_t below, mirrored in
 * platforms/runner_protocol.py as TFLM_MAILBOX) at __runner_mailbox and the model where the
 * mailbox says, and gives the inputs as a host file: NCASES times every input tensor's bytes, in
 * order. The runner reads one case at a time over semihosting, invokes the interpreter `repeats`
 * times, and appends every output tensor's bytes to the host output file. It prints, in the
 * ExecuTorch runner's line formats where they say the same thing:
 *
 *   Calibration: 2000000 instructions in 64001 SysTick ticks
 *   TFLM arena: 23456 of 1048576 bytes used in sram at 0x01080000
 *   Inference[0]: 1234 SysTick ticks
 *   Program complete, exiting.
 *
 * and exits with the runner's codes (board.h): 0 every case ran, 11 the model could not be
 * loaded, allocated or invoked.
 */
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <new>

#include "board.h"
#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/micro/micro_profiler.h"
#include "tensorflow/lite/micro/micro_time.h"
#include "tensorflow/lite/schema/schema_generated.h"
// Generated per operator set (kernels/native/tflm.py): TFLM_OPERATOR_COUNT and
// TFLM_REGISTER_OPERATORS(resolver), the MicroMutableOpResolver calls for the model's operators.
#include "tflm_operators.h"

/* "OTFL" little-endian. */
#define TFLM_MAILBOX_MAGIC 0x4C46544Fu
#define TFLM_MAILBOX_VERSION 2u
#define TFLM_INPUT_FILE "orchestrate-tflm-in"
#define TFLM_OUTPUT_FILE "orchestrate-tflm-out"

typedef struct {
  uint32_t magic;
  uint32_t version;
  uint32_t model_address;  /* the .tflite, where the harness loaded it */
  uint32_t model_bytes;
  char arena_region[RUNNER_REGION_NAME_BYTES];  /* the tensor arena's region (its free part) */
  uint32_t arena_bytes;    /* 0: all the region leaves free */
  uint32_t cases;          /* input sets in TFLM_INPUT_FILE */
  uint32_t repeats;        /* inferences per case; each is reported */
  uint32_t npu_fast_scratch_bytes;  /* the Ethos-U fast scratch (base address 2), from the arena region */
  uint32_t profile;        /* 1: TFLM's MicroProfiler times every operator (its own run: the
                              profiler's work is not in the unprofiled figures) */
} tflm_mailbox_t;

namespace {

constexpr uintptr_t kAlignment = 16;

void log_line(const char* format, ...) {
  char line[256];
  va_list args;
  va_start(args, format);
  int length = vsnprintf(line, sizeof(line) - 1, format, args);
  va_end(args);
  if (length < 0) {
    return;
  }
  if (static_cast<size_t>(length) > sizeof(line) - 2) {
    length = sizeof(line) - 2;
  }
  line[length] = '\n';
  sh_write(line, static_cast<size_t>(length) + 1);
}

const runner_region_t* find_region(const char* name) {
  for (unsigned i = 0; i < runner_region_count; i++) {
    if (strncmp(runner_regions[i].name, name, RUNNER_REGION_NAME_BYTES) == 0) {
      return &runner_regions[i];
    }
  }
  return nullptr;
}

uint8_t* align_up(uint8_t* pointer) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(pointer) + kAlignment - 1) &
                                    ~(kAlignment - 1));
}

}  // namespace

// The board's clock for TFLM (a target port provides micro_time.cc; TFLM's default returns 0):
// SysTick ticks, which QEMU's -icount turns into instructions (counters.c).
namespace tflite {
uint32_t ticks_per_second() { return RUNNER_CPU_HZ; }
uint32_t GetCurrentTimeTicks() { return static_cast<uint32_t>(counters_ticks()); }
}  // namespace tflite

// The CPU-only build links no NPU driver (../npu/ethosu_bridge.c provides the real setup).
extern "C" __attribute__((weak)) int runner_npu_setup(uint8_t* fast_scratch,
                                                      size_t fast_scratch_bytes) {
  (void)fast_scratch;
  (void)fast_scratch_bytes;
  return 0;
}

int main(void) {
  uint32_t calibration_instructions = 0;
  uint64_t calibration_ticks = 0;
  counters_calibrate(&calibration_instructions, &calibration_ticks);
  log_line("Calibration: %" PRIu32 " instructions in %llu SysTick ticks",
           calibration_instructions, static_cast<unsigned long long>(calibration_ticks));

  const volatile tflm_mailbox_t* mailbox =
      reinterpret_cast<const volatile tflm_mailbox_t*>(&__runner_mailbox);
  if (mailbox->magic != TFLM_MAILBOX_MAGIC || mailbox->version != TFLM_MAILBOX_VERSION) {
    log_line("E No TFLM mailbox (magic 0x%08" PRIx32 ", version %" PRIu32 ")", mailbox->magic,
             mailbox->version);
    return RUNNER_EXIT_ERROR;
  }
  char region_name[RUNNER_REGION_NAME_BYTES + 1] = {0};
  for (size_t i = 0; i < RUNNER_REGION_NAME_BYTES; i++) {
    region_name[i] = mailbox->arena_region[i];
  }
  const runner_region_t* region = find_region(region_name);
  if (region == nullptr) {
    log_line("E Unknown memory region '%s'", region_name);
    return RUNNER_EXIT_ERROR;
  }
  uint8_t* free_start = align_up(region->free_start);
  const uint32_t fast_bytes = mailbox->npu_fast_scratch_bytes;
  uint8_t* fast = free_start;
  if (fast_bytes != 0) {
    free_start = align_up(free_start + fast_bytes);
  }
  if (free_start >= region->free_end) {
    log_line("E The %" PRIu32 "-byte NPU fast scratch does not fit in %s", fast_bytes,
             region_name);
    return RUNNER_EXIT_ERROR;
  }
  size_t arena_bytes = static_cast<size_t>(region->free_end - free_start);
  if (mailbox->arena_bytes != 0 && mailbox->arena_bytes < arena_bytes) {
    arena_bytes = mailbox->arena_bytes;
  }
  if (runner_npu_setup(fast_bytes != 0 ? fast : nullptr, fast_bytes) != 0) {
    log_line("E Setting up the Ethos-U driver failed");
    return RUNNER_EXIT_ERROR;
  }

  const uint8_t* model_data = reinterpret_cast<const uint8_t*>(mailbox->model_address);
  log_line("TFLite model at %p: %" PRIu32 " bytes", model_data, mailbox->model_bytes);
  const tflite::Model* model = tflite::GetModel(model_data);
  if (model->version() != TFLITE_SCHEMA_VERSION) {
    log_line("E Model schema version %" PRIu32 ", the runtime reads %d",
             static_cast<uint32_t>(model->version()), TFLITE_SCHEMA_VERSION);
    return RUNNER_EXIT_ERROR;
  }
  static tflite::MicroMutableOpResolver<TFLM_OPERATOR_COUNT> resolver;
  if (!(TFLM_REGISTER_OPERATORS(resolver))) {
    log_line("E Registering the model's operators failed");
    return RUNNER_EXIT_ERROR;
  }
  static tflite::MicroProfiler profiler;
  const bool profile = mailbox->profile != 0;
  static tflite::MicroInterpreter* interpreter = nullptr;
  alignas(tflite::MicroInterpreter) static uint8_t interpreter_storage[sizeof(tflite::MicroInterpreter)];
  interpreter = new (interpreter_storage) tflite::MicroInterpreter(
      model, resolver, free_start, arena_bytes, nullptr, profile ? &profiler : nullptr);
  if (interpreter->AllocateTensors() != kTfLiteOk) {
    log_line("E AllocateTensors failed in a %zu-byte arena", arena_bytes);
    return RUNNER_EXIT_ERROR;
  }
  log_line("TFLM arena: %zu of %zu bytes used in %s at %p", interpreter->arena_used_bytes(),
           arena_bytes, region_name, free_start);
  size_t input_bytes = 0;
  for (size_t i = 0; i < interpreter->inputs_size(); i++) {
    input_bytes += interpreter->input(i)->bytes;
  }
  size_t output_bytes = 0;
  for (size_t i = 0; i < interpreter->outputs_size(); i++) {
    output_bytes += interpreter->output(i)->bytes;
  }
  log_line("TFLM model: %zu inputs (%zu bytes), %zu outputs (%zu bytes)",
           interpreter->inputs_size(), input_bytes, interpreter->outputs_size(), output_bytes);

  const int inputs = sh_open(TFLM_INPUT_FILE, 1 /* rb */);
  const int outputs = sh_open(TFLM_OUTPUT_FILE, 5 /* wb */);
  if (inputs < 0 || outputs < 0) {
    log_line("E Cannot open the host files %s and %s", TFLM_INPUT_FILE, TFLM_OUTPUT_FILE);
    return RUNNER_EXIT_ERROR;
  }
  const uint32_t repeats = mailbox->repeats != 0 ? mailbox->repeats : 1;
  size_t index = 0;
  for (uint32_t c = 0; c < mailbox->cases; c++) {
    for (size_t i = 0; i < interpreter->inputs_size(); i++) {
      TfLiteTensor* tensor = interpreter->input(i);
      if (sh_read_all(inputs, tensor->data.raw, tensor->bytes) != 0) {
        log_line("E Input file ends inside case %" PRIu32, c);
        return RUNNER_EXIT_ERROR;
      }
    }
    for (uint32_t r = 0; r < repeats; r++, index++) {
      const uint64_t before = counters_ticks();
      const TfLiteStatus status = interpreter->Invoke();
      const uint64_t ticks = counters_ticks() - before;
      if (status != kTfLiteOk) {
        log_line("E Invoke failed in case %" PRIu32, c);
        return RUNNER_EXIT_ERROR;
      }
      log_line("Inference[%zu]: %llu SysTick ticks", index, static_cast<unsigned long long>(ticks));
      if (profile) {  // "event,tag,ticks" per operator, as TFLM's MicroProfiler prints them
        log_line("TFLM profile[%zu]:", index);
        profiler.LogCsv();
        profiler.ClearEvents();
      }
    }
    for (size_t i = 0; i < interpreter->outputs_size(); i++) {
      const TfLiteTensor* tensor = interpreter->output(i);
      if (sh_write_all(outputs, tensor->data.raw, tensor->bytes) != 0) {
        log_line("E Writing the outputs of case %" PRIu32 " failed", c);
        return RUNNER_EXIT_ERROR;
      }
    }
  }
  sh_close(inputs);
  sh_close(outputs);
  log_line("Program complete, exiting.");
  return RUNNER_EXIT_PASS;
}
