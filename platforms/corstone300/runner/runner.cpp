/*
 * The runner: load the ExecuTorch program the harness placed in memory, run each BundleIO test
 * case and compare the outputs with the expected ones bundled beside them (the host twin's), and
 * report PASS/FAIL per case with the counters of each inference.
 *
 * Where things are comes from the mailbox (board.h) the harness wrote before reset: the image
 * (.bpte, or a plain .pte that is run once on zeroed inputs without a verdict), the region of
 * each memory-planned buffer (the regions the plan chose for the arenas, one per ExecuTorch
 * mem_id) and the region for the method and temp allocators, and the region for the CPU weights when the plan moved them out of
 * the image (the constant segment is copied there at load). The free part of every region is
 * known from the linker script.
 *
 * Log lines follow ExecuTorch's Arm executor runner (`TEST: BundleIO index[i] Test_result:
 * PASS`), so platforms/fvp.py reads them too.
 */
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <executorch/devtools/bundled_program/bundled_program.h>
#include <executorch/devtools/bundled_program/schema/bundled_program_schema_generated.h>
#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/runtime/core/event_tracer.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/log.h>
#include <executorch/runtime/platform/runtime.h>

#include "board.h"

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::extension::BufferDataLoader;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::MemoryAllocator;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::MethodMeta;
using executorch::runtime::Program;
using executorch::runtime::Result;
using executorch::runtime::Span;

namespace {

constexpr size_t kMaxPlannedBuffers = 16;
constexpr size_t kBufferAlignment = 16;

struct Pool {
  const char* name = nullptr;
  uint8_t* start = nullptr;
  uint8_t* end = nullptr;
  size_t bytes() const {
    return static_cast<size_t>(end - start);
  }
};

// The free part of region `name`, minus the program image if it lies there.
bool find_pool(const char* name, const uint8_t* image, size_t image_bytes, Pool* pool) {
  for (unsigned i = 0; i < runner_region_count; i++) {
    const runner_region_t& region = runner_regions[i];
    if (std::strncmp(region.name, name, RUNNER_REGION_NAME_BYTES) != 0) {
      continue;
    }
    pool->name = region.name;
    pool->start = region.free_start;
    pool->end = region.free_end;
    const uint8_t* image_end = image + image_bytes;
    if (image < pool->end && image_end > pool->start) {
      // Keep the larger side of the image.
      size_t below = static_cast<size_t>(image - pool->start);
      size_t above = static_cast<size_t>(pool->end - image_end);
      if (below >= above) {
        pool->end = const_cast<uint8_t*>(image);
      } else {
        pool->start = const_cast<uint8_t*>(image_end);
      }
    }
    return true;
  }
  return false;
}

// The program's data loader: every segment is read where the image lies (BufferDataLoader),
// except the constant segment (the CPU weights) when the plan put the weights in another region:
// then it is copied at load time into that region's free part, and the program's tensors point
// at the copy. Logs where the constant segment is read from either way.
class WeightsLoader final : public executorch::runtime::DataLoader {
 public:
  WeightsLoader(BufferDataLoader* inner, const Pool* weights)
      : inner_(inner), weights_(weights) {}

  Result<FreeableBuffer> load(size_t offset, size_t size,
                              const SegmentInfo& segment_info) const override {
    Result<FreeableBuffer> loaded = inner_->load(offset, size, segment_info);
    if (!loaded.ok() || segment_info.segment_type != SegmentInfo::Type::Constant) {
      return loaded;
    }
    const uint8_t* source = static_cast<const uint8_t*>(loaded->data());
    if (weights_ == nullptr) {
      ET_LOG(Info, "constant segment: %zu bytes read in place at 0x%08" PRIx32, size,
             static_cast<uint32_t>(reinterpret_cast<uintptr_t>(source)));
      return loaded;
    }
    // Program::load asks for the constant segment once; a second request gets a second copy.
    uint8_t* start = weights_->start + used_;
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(start) + kBufferAlignment - 1) &
                        ~static_cast<uintptr_t>(kBufferAlignment - 1);
    uint8_t* copy = reinterpret_cast<uint8_t*>(aligned);
    if (copy > weights_->end || static_cast<size_t>(weights_->end - copy) < size) {
      ET_LOG(Error, "constant segment: %zu bytes do not fit in %s (%zu bytes free): the weights "
             "cannot be placed where the plan put them", size, weights_->name,
             weights_->bytes() - used_);
      failed_ = true;
      return Error::MemoryAllocationFailed;
    }
    std::memcpy(copy, source, size);
    used_ = static_cast<size_t>(copy + size - weights_->start);
    ET_LOG(Info, "constant segment: %zu bytes copied to %s at 0x%08" PRIx32, size, weights_->name,
           static_cast<uint32_t>(aligned));
    return FreeableBuffer(copy, size, /*free_fn=*/nullptr);
  }

  Error load_into(size_t offset, size_t size, const SegmentInfo& segment_info,
                  void* buffer) const override {
    return inner_->load_into(offset, size, segment_info, buffer);
  }

  Result<size_t> size() const override {
    return inner_->size();
  }

  // Bytes of the weights pool the copies took (alignment included).
  size_t used() const {
    return used_;
  }
  // The constant segment did not fit in the weights pool.
  bool failed() const {
    return failed_;
  }

 private:
  BufferDataLoader* inner_;
  const Pool* weights_;  // nullptr: the weights stay in the image
  mutable size_t used_ = 0;
  mutable bool failed_ = false;
};

// Takes the first `bytes` of `pool` away when it starts where `taken` starts (the same region).
void skip_taken(const Pool& taken, size_t bytes, Pool* pool) {
  if (bytes != 0 && pool->start == taken.start) {
    pool->start += bytes < pool->bytes() ? bytes : pool->bytes();
  }
}

void region_name(const volatile char* field, char* out) {
  for (size_t i = 0; i < RUNNER_REGION_NAME_BYTES; i++) {
    out[i] = field[i];
  }
  out[RUNNER_REGION_NAME_BYTES] = '\0';
}

constexpr size_t kReportedElements = 4;

// Counts the elements that differ and logs the first few (flat index in memory order).
template <typename T>
void compare_elements(const void* expected, const void* actual, size_t count, size_t output,
                      size_t* differing, double* max_abs_error) {
  const T* e = static_cast<const T*>(expected);
  const T* a = static_cast<const T*>(actual);
  for (size_t k = 0; k < count; k++) {
    if (std::memcmp(&e[k], &a[k], sizeof(T)) != 0) {
      if (*differing < kReportedElements) {
        ET_LOG(Error, "Output %zu element %zu: expected %.9g, got %.9g", output, k,
               static_cast<double>(e[k]), static_cast<double>(a[k]));
      }
      (*differing)++;
      double error = std::fabs(static_cast<double>(a[k]) - static_cast<double>(e[k]));
      if (error > *max_abs_error || std::isnan(error)) {
        *max_abs_error = error;
      }
    }
  }
}

// FNV-1a (64-bit) of an output's bytes in memory order: the host compares it with the bytes a
// candidate expectation would give (a float on a rounding boundary, orchestrator/verification).
uint64_t fnv1a64(const void* data, size_t bytes) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < bytes; i++) {
    hash = (hash ^ p[i]) * 0x100000001b3ULL;
  }
  return hash;
}

// For a failed case: how many output elements differ from the bundled ones, and by how much.
void report_mismatch(Method& method, const bundled_program_flatbuffer::BundledMethodTestCase* test,
                     size_t index) {
  const auto* expected_outputs = test->expected_outputs();
  for (size_t o = 0; o < method.outputs_size() && o < expected_outputs->size(); o++) {
    const auto* value = expected_outputs->Get(static_cast<flatbuffers::uoffset_t>(o));
    const EValue& output = method.get_output(o);
    if (value->val_type() != bundled_program_flatbuffer::ValueUnion::Tensor || !output.isTensor()) {
      continue;
    }
    const auto* expected = value->val_as_Tensor();
    const Tensor actual = output.toTensor();
    size_t count = static_cast<size_t>(actual.numel());
    size_t differing = 0;
    double max_abs_error = 0.0;
    const void* e = expected->data()->data();
    const void* a = actual.const_data_ptr();
    if (expected->data()->size() < actual.nbytes()) {
      ET_LOG(Error, "Output %zu of case %zu: %u expected bytes for a %zu-byte output", o, index,
             static_cast<unsigned>(expected->data()->size()), actual.nbytes());
      continue;
    }
    switch (actual.scalar_type()) {
      case ScalarType::Float:
        compare_elements<float>(e, a, count, o, &differing, &max_abs_error);
        break;
      case ScalarType::Char:
        compare_elements<int8_t>(e, a, count, o, &differing, &max_abs_error);
        break;
      case ScalarType::Byte:
      case ScalarType::Bool:
        compare_elements<uint8_t>(e, a, count, o, &differing, &max_abs_error);
        break;
      case ScalarType::Short:
        compare_elements<int16_t>(e, a, count, o, &differing, &max_abs_error);
        break;
      case ScalarType::Int:
        compare_elements<int32_t>(e, a, count, o, &differing, &max_abs_error);
        break;
      case ScalarType::Long:
        compare_elements<int64_t>(e, a, count, o, &differing, &max_abs_error);
        break;
      default:
        differing = std::memcmp(e, a, actual.nbytes()) != 0 ? count : 0;
        break;
    }
    ET_LOG(Error, "Output %zu of case %zu: %zu of %zu elements differ, max abs error %g", o, index,
           differing, count, max_abs_error);
    const uint64_t digest = fnv1a64(a, actual.nbytes());
    ET_LOG(Info, "Output %zu of case %zu: FNV-1a 0x%08lx%08lx", o, index,
           static_cast<unsigned long>(digest >> 32), static_cast<unsigned long>(digest & 0xffffffffUL));
  }
}

#if defined(ET_EVENT_TRACER_ENABLED)
// The trace build (kernels/native/runner.py, trace=True): for every instruction of the method, its
// clock ticks and a CRC-32 of each tensor its kernel logged (the outputs), so a mismatch can be
// traced to the first operator whose bytes differ from the host twin's, and the whole inference
// (Method::execute); `verify --qemu --profile` writes these as an ETDump. Records are printed after
// the inference; the CRCs must be taken when the kernel returns (planned memory is reused), and
// the ticks they take are subtracted from every enclosing scope. Each start is on that same
// timeline: the clock minus the tracer's own ticks so far.
//
// The clock: the DWT cycle counter where it counts (silicon, FVP), else SysTick ticks (under QEMU,
// which has no DWT, they are calibrated to instructions on the host: counters.c). The DWT's 32
// bits are extended to 64: the tracer reads it at every scope, far more often than it wraps.
bool trace_clock_is_dwt() {
  return counters_have_cycle_counter() != 0;
}

uint64_t trace_clock() {
  if (!trace_clock_is_dwt()) {
    return counters_ticks();
  }
  static uint32_t last = 0;
  static uint64_t wraps = 0;
  const uint32_t now = counters_cycles();
  if (now < last) {
    wraps += 1ull << 32;
  }
  last = now;
  return wraps | now;
}

uint32_t crc32(const uint8_t* data, size_t bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < bytes; i++) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; bit++) {
      crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
  }
  return ~crc;
}

constexpr char kKernelScopePrefix[] = "native_call_";  // the generated registration's op scope

class InstructionTracer final : public executorch::runtime::EventTracer {
 public:
  InstructionTracer() {
    set_event_tracer_debug_level(executorch::runtime::EventTracerDebugLogLevel::kIntermediateOutputs);
  }
  void create_event_block(const char*) override {}
  executorch::runtime::EventTracerEntry start_profiling(
      const char* name, executorch::runtime::ChainID, executorch::runtime::DebugHandle) override {
    // The bookkeeping here is the tracer's own work too: the enclosing scopes do not keep it.
    const uint64_t entered = trace_clock();
    executorch::runtime::EventTracerEntry entry{};
    entry.event_id = static_cast<int64_t>(depth_++);
    if (std::strncmp(name, kKernelScopePrefix, sizeof(kKernelScopePrefix) - 1) == 0) {
      logged_count_ = 0;
    }
    entry.start_time = trace_clock();
    overhead_ticks_ += entry.start_time - entered;
    if (entry.event_id < static_cast<int64_t>(kMaxDepth)) {
      frames_[entry.event_id] = {name, current_chain_id(), current_debug_handle(), overhead_ticks_};
    }
    return entry;
  }
  void end_profiling(executorch::runtime::EventTracerEntry entry) override {
    const uint64_t now = trace_clock();
    depth_ = static_cast<size_t>(entry.event_id);
    if (depth_ >= kMaxDepth) {
      return;
    }
    const Frame& frame = frames_[depth_];
    const uint64_t ticks = now - entry.start_time - (overhead_ticks_ - frame.overhead_at_start);
    const uint64_t start = entry.start_time - frame.overhead_at_start;
    if (frame.chain_id == executorch::runtime::kUnsetChainId) {
      // Method::init has no instruction; Method::execute is the whole inference.
      if (std::strcmp(frame.name, "Method::execute") == 0) {
        execute_ticks_ = ticks;
        execute_start_ = start;
        execute_seen_ = true;
      }
      return;
    }
    if (std::strncmp(frame.name, kKernelScopePrefix, sizeof(kKernelScopePrefix) - 1) == 0) {
      pending_.kernel = frame.name + sizeof(kKernelScopePrefix) - 1;
      pending_.kernel_ticks = ticks;
      pending_.kernel_start = start;
      pending_.tensors = 0;
      for (size_t i = 0; i < logged_count_; i++) {
        pending_.bytes[i] = static_cast<uint32_t>(logged_[i].bytes);
        pending_.crc[i] = crc32(logged_[i].data, logged_[i].bytes);
        pending_.tensors++;
      }
      logged_count_ = 0;
    } else if (records_count_ < kMaxRecords) {
      Record& record = records_[records_count_++];
      record = pending_;
      record.kind = frame.name;
      record.instruction = frame.debug_handle;
      record.ticks = ticks;
      record.start = start;
      pending_ = Record{};
    }
    overhead_ticks_ += trace_clock() - now;
  }
  // Prints the records of one inference and forgets them; the whole inference last.
  void flush(size_t index) {
    for (size_t r = 0; r < records_count_; r++) {
      const Record& record = records_[r];
      ET_LOG(Info, "Trace[%zu] instruction %" PRIu32 " %s %s: %" PRIu64 " ticks from %" PRIu64
             " (kernel %" PRIu64 " from %" PRIu64 ")",
             index, record.instruction, record.kind, record.kernel ? record.kernel : "-",
             record.ticks, record.start, record.kernel_ticks, record.kernel_start);
      for (size_t i = 0; i < record.tensors; i++) {
        ET_LOG(Info, "Trace[%zu] instruction %" PRIu32 " tensor %zu: %" PRIu32 " bytes crc32 %08" PRIx32,
               index, record.instruction, i, record.bytes[i], record.crc[i]);
      }
    }
    if (records_count_ == kMaxRecords) {
      ET_LOG(Error, "Trace[%zu]: only the first %zu instructions were recorded", index, kMaxRecords);
    }
    if (execute_seen_) {
      ET_LOG(Info, "Trace[%zu] Method::execute: %" PRIu64 " ticks from %" PRIu64, index,
             execute_ticks_, execute_start_);
    }
    records_count_ = 0;
    execute_seen_ = false;
  }
  executorch::runtime::EventTracerEntry start_profiling_delegate(
      const char* name, executorch::runtime::DelegateDebugIntId) override {
    return start_profiling(name, executorch::runtime::kUnsetChainId,
                           executorch::runtime::kUnsetDebugHandle);
  }
  void end_profiling_delegate(executorch::runtime::EventTracerEntry entry, const void*,
                              size_t) override {
    end_profiling(entry);
  }
  void log_profiling_delegate(const char*, executorch::runtime::DelegateDebugIntId, et_timestamp_t,
                              et_timestamp_t, const void*, size_t) override {}
  void track_allocation(executorch::runtime::AllocatorID, size_t) override {}
  executorch::runtime::AllocatorID track_allocator(const char*) override {
    return 0;
  }
  Result<bool> log_evalue(const EValue& value, executorch::runtime::LoggedEValueType) override {
    if (value.isTensor() && logged_count_ < kMaxTensors) {
      const Tensor tensor = value.toTensor();
      logged_[logged_count_++] = {static_cast<const uint8_t*>(tensor.const_data_ptr()),
                                  tensor.nbytes()};
    }
    return true;
  }
  Result<bool> log_intermediate_output_delegate(const char*, executorch::runtime::DelegateDebugIntId,
                                                const Tensor&) override {
    return true;
  }
  Result<bool> log_intermediate_output_delegate(const char*, executorch::runtime::DelegateDebugIntId,
                                                const executorch::runtime::ArrayRef<Tensor>) override {
    return true;
  }
  Result<bool> log_intermediate_output_delegate(const char*, executorch::runtime::DelegateDebugIntId,
                                                const int&) override {
    return true;
  }
  Result<bool> log_intermediate_output_delegate(const char*, executorch::runtime::DelegateDebugIntId,
                                                const bool&) override {
    return true;
  }
  Result<bool> log_intermediate_output_delegate(const char*, executorch::runtime::DelegateDebugIntId,
                                                const double&) override {
    return true;
  }
  void set_delegation_intermediate_output_filter(executorch::runtime::EventTracerFilterBase*) override {}

 private:
  static constexpr size_t kMaxDepth = 8;
  static constexpr size_t kMaxTensors = 4;
  static constexpr size_t kMaxRecords = 512;
  struct Frame {
    const char* name;
    executorch::runtime::ChainID chain_id;
    executorch::runtime::DebugHandle debug_handle;
    uint64_t overhead_at_start;
  };
  struct Logged {
    const uint8_t* data;
    size_t bytes;
  };
  struct Record {
    uint32_t instruction = 0;
    const char* kind = nullptr;
    const char* kernel = nullptr;
    uint64_t ticks = 0;
    uint64_t start = 0;
    uint64_t kernel_ticks = 0;
    uint64_t kernel_start = 0;
    size_t tensors = 0;
    uint32_t bytes[kMaxTensors] = {};
    uint32_t crc[kMaxTensors] = {};
  };
  Frame frames_[kMaxDepth] = {};
  size_t depth_ = 0;
  uint64_t overhead_ticks_ = 0;
  Logged logged_[kMaxTensors] = {};
  size_t logged_count_ = 0;
  Record pending_;
  Record records_[kMaxRecords];
  size_t records_count_ = 0;
  uint64_t execute_ticks_ = 0;
  uint64_t execute_start_ = 0;
  bool execute_seen_ = false;
};

InstructionTracer tracer;
executorch::runtime::EventTracer* const event_tracer = &tracer;
#else
executorch::runtime::EventTracer* const event_tracer = nullptr;
#endif

}  // namespace

// The CPU-only build links no NPU driver (npu/ethosu_bridge.c provides the real setup).
extern "C" __attribute__((weak)) int runner_npu_setup(uint8_t* fast_scratch,
                                                      size_t fast_scratch_bytes) {
  (void)fast_scratch;
  (void)fast_scratch_bytes;
  return 0;
}

int main(void) {
  executorch::runtime::runtime_init();

  uint32_t calibration_instructions = 0;
  uint64_t calibration_ticks = 0;
  counters_calibrate(&calibration_instructions, &calibration_ticks);
  ET_LOG(Info, "Calibration: %" PRIu32 " instructions in %" PRIu64 " SysTick ticks",
         calibration_instructions, calibration_ticks);
#if defined(ET_EVENT_TRACER_ENABLED)
  ET_LOG(Info, "Trace clock: %s", trace_clock_is_dwt() ? "DWT cycles" : "SysTick ticks");
#endif

  const volatile runner_mailbox_t& mailbox = __runner_mailbox;
  if (mailbox.magic != RUNNER_MAILBOX_MAGIC || mailbox.version != RUNNER_MAILBOX_VERSION) {
    ET_LOG(Error, "No program: the mailbox at %p holds magic 0x%08" PRIx32 " version %" PRIu32,
           static_cast<const volatile void*>(&mailbox), mailbox.magic, mailbox.version);
    return RUNNER_EXIT_ERROR;
  }
  uint8_t* image = reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(mailbox.image_address));
  const size_t image_bytes = mailbox.image_bytes;
  char planned_names[RUNNER_MAILBOX_PLANNED][RUNNER_REGION_NAME_BYTES + 1];
  char runtime_name[RUNNER_REGION_NAME_BYTES + 1];
  char weights_name[RUNNER_REGION_NAME_BYTES + 1];
  for (size_t i = 0; i < RUNNER_MAILBOX_PLANNED; i++) {
    region_name(mailbox.planned_regions[i], planned_names[i]);
  }
  region_name(mailbox.runtime_region, runtime_name);
  region_name(mailbox.weights_region, weights_name);
  const double rtol = mailbox.rtol;
  const double atol = mailbox.atol;
  const uint32_t repeats = mailbox.repeats > 0 ? mailbox.repeats : 1;

  const void* program_data = image;
  size_t program_bytes = image_bytes;
  const bool bundled = executorch::bundled_program::is_bundled_program(image, image_bytes);
  if (bundled) {
    Error status = executorch::bundled_program::get_program_data(image, image_bytes,
                                                                 &program_data, &program_bytes);
    if (status != Error::Ok) {
      ET_LOG(Error, "The .bpte at %p holds no program: 0x%" PRIx32, image,
             static_cast<uint32_t>(status));
      return RUNNER_EXIT_ERROR;
    }
  }
  ET_LOG(Info, "%s at %p: %zu bytes, program %zu bytes", bundled ? "BundleIO .bpte" : ".pte",
         image, image_bytes, program_bytes);

  // The CPU weights go where the plan put them: copied into the weights region's free part when
  // the mailbox names one, else read in place from the image.
  Pool weights_pool;
  const bool weights_moved = weights_name[0] != '\0';
  if (weights_moved && !find_pool(weights_name, image, image_bytes, &weights_pool)) {
    ET_LOG(Error, "Unknown memory region '%s' for the weights", weights_name);
    return RUNNER_EXIT_ERROR;
  }
  BufferDataLoader image_loader(program_data, program_bytes);
  WeightsLoader loader(&image_loader, weights_moved ? &weights_pool : nullptr);
  Result<Program> program = Program::load(&loader, Program::Verification::InternalConsistency);
  if (loader.failed()) {
    return RUNNER_EXIT_ERROR;
  }
  if (!program.ok()) {
    ET_LOG(Error, "Program loading failed: 0x%" PRIx32, static_cast<uint32_t>(program.error()));
    return RUNNER_EXIT_ERROR;
  }
  Result<const char*> method_name = program->get_method_name(0);
  if (!method_name.ok()) {
    ET_LOG(Error, "The program has no method");
    return RUNNER_EXIT_ERROR;
  }
  Result<MethodMeta> meta = program->method_meta(*method_name);
  if (!meta.ok()) {
    ET_LOG(Error, "No metadata for method %s", *method_name);
    return RUNNER_EXIT_ERROR;
  }

  // One pool per region: the planned buffers take their region's pool from its start, in
  // mem_id order; the method and temp allocators get what the runtime region has left.
  const size_t planned_count = meta->num_memory_planned_buffers();
  if (planned_count > kMaxPlannedBuffers) {
    ET_LOG(Error, "%zu planned buffers; the runner has room for %zu", planned_count,
           kMaxPlannedBuffers);
    return RUNNER_EXIT_ERROR;
  }
  Pool pools[RUNNER_MAILBOX_PLANNED + 1];
  size_t pool_count = 0;
  auto pool_for = [&](const char* name) -> Pool* {
    for (size_t i = 0; i < pool_count; i++) {
      if (std::strncmp(pools[i].name, name, RUNNER_REGION_NAME_BYTES) == 0) {
        return &pools[i];
      }
    }
    Pool* pool = &pools[pool_count];
    if (pool_count == RUNNER_MAILBOX_PLANNED + 1 || !find_pool(name, image, image_bytes, pool)) {
      ET_LOG(Error, "Unknown memory region '%s'", name);
      return nullptr;
    }
    // The copied weights keep their bytes: the others take what they leave of a shared region.
    if (weights_moved) {
      skip_taken(weights_pool, loader.used(), pool);
    }
    pool_count++;
    return pool;
  };
  Pool* runtime_pool = pool_for(runtime_name);
  if (runtime_pool == nullptr) {
    return RUNNER_EXIT_ERROR;
  }
  // The Ethos-U fast scratch, from the start of the runtime region's pool.
  {
    const size_t fast_bytes = mailbox.npu_fast_scratch_bytes;
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(runtime_pool->start) + kBufferAlignment - 1) &
                        ~static_cast<uintptr_t>(kBufferAlignment - 1);
    uint8_t* fast = reinterpret_cast<uint8_t*>(aligned);
    if (fast_bytes != 0 && (fast > runtime_pool->end ||
                            fast_bytes > static_cast<size_t>(runtime_pool->end - fast))) {
      ET_LOG(Error, "The %zu-byte NPU fast scratch does not fit in %s", fast_bytes,
             runtime_pool->name);
      return RUNNER_EXIT_ERROR;
    }
    if (fast_bytes != 0) {
      runtime_pool->start = fast + fast_bytes;
    }
    if (runner_npu_setup(fast_bytes != 0 ? fast : nullptr, fast_bytes) != 0) {
      ET_LOG(Error, "Setting up the Ethos-U driver failed");
      return RUNNER_EXIT_ERROR;
    }
  }
  Span<uint8_t> planned_spans[kMaxPlannedBuffers];
  size_t planned_bytes = 0;
  for (size_t id = 0; id < planned_count; id++) {
    const char* name = id < RUNNER_MAILBOX_PLANNED && planned_names[id][0] != '\0'
                           ? planned_names[id]
                           : planned_names[0];
    Pool* pool = pool_for(name);
    if (pool == nullptr) {
      return RUNNER_EXIT_ERROR;
    }
    size_t size = static_cast<size_t>(meta->memory_planned_buffer_size(id).get());
    uint8_t* buffer = nullptr;
    if (size != 0) {
      uintptr_t aligned = (reinterpret_cast<uintptr_t>(pool->start) + kBufferAlignment - 1) &
                          ~static_cast<uintptr_t>(kBufferAlignment - 1);
      buffer = reinterpret_cast<uint8_t*>(aligned);
      if (buffer > pool->end || size > static_cast<size_t>(pool->end - buffer)) {
        ET_LOG(Error, "Planned buffer %zu (%zu bytes) does not fit in %s (%zu bytes free)", id,
               size, pool->name, pool->bytes());
        return RUNNER_EXIT_ERROR;
      }
      pool->start = buffer + size;
      std::memset(buffer, 0, size);
    }
    ET_LOG(Info, "planned buffer %zu (mem_id %zu): %zu bytes in %s at %p", id, id + 1, size,
           pool->name, static_cast<void*>(buffer));
    planned_spans[id] = Span<uint8_t>(buffer, size);
    planned_bytes += size;
  }
  // The method allocator holds the runtime's per-method structures (a few KiB); kernels' temp
  // allocations get a quarter of the pool.
  const size_t temp_bytes = (runtime_pool->bytes() / 4) & ~(kBufferAlignment - 1);
  MemoryAllocator method_allocator(static_cast<uint32_t>(runtime_pool->bytes() - temp_bytes),
                                   runtime_pool->start);
  MemoryAllocator temp_allocator(static_cast<uint32_t>(temp_bytes),
                                 runtime_pool->end - temp_bytes);
  HierarchicalAllocator planned_memory(Span<Span<uint8_t>>(planned_spans, planned_count));
  MemoryManager memory_manager(&method_allocator, &planned_memory, &temp_allocator);

  Result<Method> method = program->load_method(*method_name, &memory_manager, event_tracer);
  if (!method.ok()) {
    ET_LOG(Error, "Loading method %s failed: 0x%" PRIx32, *method_name,
           static_cast<uint32_t>(method.error()));
    return RUNNER_EXIT_ERROR;
  }
  ET_LOG(Info, "Method '%s' loaded: %zu inputs, %zu outputs", *method_name, method->inputs_size(),
         method->outputs_size());
  ET_LOG(Info, "planned_buffers_bytes : %zu", planned_bytes);
  ET_LOG(Info, "method_allocator_used : %zu in %s", method_allocator.used_size(),
         runtime_pool->name);

  const bundled_program_flatbuffer::BundledMethodTestSuite* suite = nullptr;
  if (bundled) {
    const auto* suites = bundled_program_flatbuffer::GetBundledProgram(image)->method_test_suites();
    for (flatbuffers::uoffset_t i = 0; suites != nullptr && i < suites->size(); i++) {
      if (std::strcmp(suites->Get(i)->method_name()->c_str(), *method_name) == 0) {
        suite = suites->Get(i);
      }
    }
    if (suite == nullptr || suite->test_cases() == nullptr || suite->test_cases()->size() == 0) {
      ET_LOG(Error, "The .bpte has no test case for method %s", *method_name);
      return RUNNER_EXIT_ERROR;
    }
  }
  const size_t cases = bundled ? suite->test_cases()->size() : 1;
  if (!bundled) {
    // A plain .pte brings no inputs: mark the (zeroed, memory-planned) input tensors as set by
    // handing each back to the method; copy_tensor_data then copies the zeros onto themselves.
    for (size_t i = 0; i < method->inputs_size(); i++) {
      const EValue input = method->get_input(i);
      Error status = method->set_input(input, i);
      if (status != Error::Ok) {
        ET_LOG(Error, "Input %zu of the plain .pte could not be set: 0x%" PRIx32, i,
               static_cast<uint32_t>(status));
        return RUNNER_EXIT_ERROR;
      }
    }
  }

  bool all_passed = true;
  for (size_t index = 0; index < cases; index++) {
    if (bundled) {
      Error status = executorch::bundled_program::load_bundled_input(*method, image, index);
      if (status != Error::Ok) {
        ET_LOG(Error, "Loading the inputs of case %zu failed: 0x%" PRIx32, index,
               static_cast<uint32_t>(status));
        return RUNNER_EXIT_ERROR;
      }
    }
    for (uint32_t repeat = 0; repeat < repeats; repeat++) {
      const uint32_t cycles_before = counters_cycles();
      const uint64_t ticks_before = counters_ticks();
      Error status = method->execute();
      const uint64_t ticks = counters_ticks() - ticks_before;
      const uint32_t cycles = counters_cycles() - cycles_before;
      if (status != Error::Ok) {
        ET_LOG(Error, "Inference %zu failed: 0x%" PRIx32, index, static_cast<uint32_t>(status));
        return RUNNER_EXIT_ERROR;
      }
      ET_LOG(Info, "Inference[%zu]: %" PRIu64 " SysTick ticks", index, ticks);
#if defined(ET_EVENT_TRACER_ENABLED)
      tracer.flush(index);
#endif
      if (counters_have_cycle_counter()) {
        ET_LOG(Info, "Inference[%zu] CPU cycles : %" PRIu32, index, cycles);
      }
    }
    if (!bundled) {
      ET_LOG(Info, "Plain .pte: ran on zeroed inputs, no expected outputs to compare");
      continue;
    }
    Error verdict = executorch::bundled_program::verify_method_outputs(*method, image, index, rtol,
                                                                       atol);
    if (verdict == Error::Ok) {
      ET_LOG(Info, "TEST: BundleIO index[%zu] Test_result: PASS", index);
    } else {
      all_passed = false;
      report_mismatch(*method, suite->test_cases()->Get(static_cast<flatbuffers::uoffset_t>(index)),
                      index);
      ET_LOG(Error, "TEST: BundleIO index[%zu] Test_result: FAIL (rtol=%g atol=%g)", index, rtol,
             atol);
    }
  }
  ET_LOG(Info, "Program complete, exiting.");
  return all_passed ? RUNNER_EXIT_PASS : RUNNER_EXIT_MISMATCH;
}
