/*
 * model_init / model_run over ExecuTorch's runtime (see model.h). Every buffer is static and
 * placed by the generated model_memory.c and memory.ld where the plan put it: the program image,
 * each memory-planned arena (one per ExecuTorch mem_id), the CPU weights when the plan copies
 * them out of the image, the method pool and the kernels' scratch (the temp pool).
 */
#include <cstring>

#include <executorch/extension/data_loader/buffer_data_loader.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>

#include "model.h"
#include "model_memory.h"

using executorch::aten::Tensor;
using executorch::extension::BufferDataLoader;
using executorch::runtime::DataLoader;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::runtime::FreeableBuffer;
using executorch::runtime::HierarchicalAllocator;
using executorch::runtime::MemoryAllocator;
using executorch::runtime::MemoryManager;
using executorch::runtime::Method;
using executorch::runtime::Program;
using executorch::runtime::Result;
using executorch::runtime::Span;

#ifndef MODEL_PROGRAM_VERIFICATION
#define MODEL_PROGRAM_VERIFICATION Program::Verification::Minimal
#endif

namespace {

// The image's loader: every segment is read in place, except the constant segment (the CPU
// weights) when the plan put them in another region, where it is copied once at load.
class ImageLoader final : public DataLoader {
 public:
  ImageLoader(const void* image, size_t bytes) : inner_(image, bytes) {}

  Result<FreeableBuffer> load(size_t offset, size_t size,
                              const SegmentInfo& segment_info) const override {
    Result<FreeableBuffer> loaded = inner_.load(offset, size, segment_info);
    if (!loaded.ok() || segment_info.segment_type != SegmentInfo::Type::Constant ||
        model_weights_pool_bytes == 0) {
      return loaded;
    }
    if (size > model_weights_pool_bytes || copied_) {
      return Error::MemoryAllocationFailed;
    }
    std::memcpy(model_weights_pool, loaded->data(), size);
    copied_ = true;
    return FreeableBuffer(model_weights_pool, size, /*free_fn=*/nullptr);
  }

  Error load_into(size_t offset, size_t size, const SegmentInfo& segment_info,
                  void* buffer) const override {
    return inner_.load_into(offset, size, segment_info, buffer);
  }

  Result<size_t> size() const override {
    return inner_.size();
  }

 private:
  mutable BufferDataLoader inner_;
  mutable bool copied_ = false;
};

// Storage for the runtime objects, constructed in place by model_init (no heap).
alignas(ImageLoader) uint8_t loader_storage[sizeof(ImageLoader)];
alignas(Result<Program>) uint8_t program_storage[sizeof(Result<Program>)];
alignas(MemoryAllocator) uint8_t method_allocator_storage[sizeof(MemoryAllocator)];
alignas(MemoryAllocator) uint8_t temp_allocator_storage[sizeof(MemoryAllocator)];
alignas(HierarchicalAllocator) uint8_t planned_storage[sizeof(HierarchicalAllocator)];
alignas(MemoryManager) uint8_t manager_storage[sizeof(MemoryManager)];
alignas(Result<Method>) uint8_t method_storage[sizeof(Result<Method>)];
Span<uint8_t> planned_spans[MODEL_PLANNED_BUFFERS > 0 ? MODEL_PLANNED_BUFFERS : 1];
Method* method = nullptr;
MemoryAllocator* method_allocator = nullptr;
MemoryAllocator* temp_allocator = nullptr;
MemoryManager* manager = nullptr;
Program* program = nullptr;

const size_t input_bytes[] = MODEL_INPUT_BYTES_LIST;
const size_t output_bytes[] = MODEL_OUTPUT_BYTES_LIST;

// The method, loaded into the pools model_init made (again by model_reset).
model_status_t load_method() {
  auto* loaded =
      new (method_storage) Result<Method>(program->load_method(MODEL_METHOD_NAME, manager));
  if (!loaded->ok()) {
    return MODEL_ERROR_METHOD;
  }
  method = &loaded->get();
  if (method->inputs_size() != MODEL_INPUT_COUNT || method->outputs_size() != MODEL_OUTPUT_COUNT) {
    return MODEL_ERROR_IO;
  }
  return MODEL_OK;
}

}  // namespace

extern "C" model_status_t model_init(void) {
  executorch::runtime::runtime_init();
#if MODEL_NPU_PARTITIONS > 0
  if (model_npu_setup() != 0) {
    return MODEL_ERROR_NPU;
  }
#endif
  auto* loader = new (loader_storage) ImageLoader(model_pte, model_pte_bytes);
  auto* loaded =
      new (program_storage) Result<Program>(Program::load(loader, MODEL_PROGRAM_VERIFICATION));
  if (!loaded->ok()) {
    return MODEL_ERROR_PROGRAM;
  }
  program = &loaded->get();
  for (size_t id = 0; id < MODEL_PLANNED_BUFFERS; id++) {
    planned_spans[id] = Span<uint8_t>(model_planned_buffers[id], model_planned_buffer_bytes[id]);
  }
  method_allocator = new (method_allocator_storage)
      MemoryAllocator(static_cast<uint32_t>(model_method_pool_bytes), model_method_pool);
  temp_allocator = new (temp_allocator_storage)
      MemoryAllocator(static_cast<uint32_t>(model_temp_pool_bytes), model_temp_pool);
  auto* planned = new (planned_storage)
      HierarchicalAllocator(Span<Span<uint8_t>>(planned_spans, MODEL_PLANNED_BUFFERS));
  manager = new (manager_storage) MemoryManager(method_allocator, planned, temp_allocator);
  return load_method();
}

extern "C" model_status_t model_reset(void) {
  if (method == nullptr) {
    return MODEL_ERROR_NOT_INIT;
  }
  // Loading the method writes each state's initial values (the program's mutable segment) into
  // its planned buffer: the state starts again. The old method goes first (its delegates are
  // destroyed), and its pools with it.
  method = nullptr;
  reinterpret_cast<Result<Method>*>(method_storage)->~Result<Method>();
  method_allocator->reset();
  temp_allocator->reset();
  return load_method();
}

extern "C" model_status_t model_run(const void* const inputs[MODEL_INPUT_COUNT],
                                    void* const outputs[MODEL_OUTPUT_COUNT]) {
  if (method == nullptr) {
    return MODEL_ERROR_NOT_INIT;
  }
  // The inputs are memory-planned tensors: their bytes are copied in place, then handed back to
  // the method so it takes them as set.
  for (size_t i = 0; i < MODEL_INPUT_COUNT; i++) {
    const EValue input = method->get_input(i);
    if (!input.isTensor() || input.toTensor().nbytes() != input_bytes[i]) {
      return MODEL_ERROR_IO;
    }
    std::memcpy(input.toTensor().mutable_data_ptr(), inputs[i], input_bytes[i]);
    if (method->set_input(input, i) != Error::Ok) {
      return MODEL_ERROR_IO;
    }
  }
  if (method->execute() != Error::Ok) {
    return MODEL_ERROR_RUN;
  }
  for (size_t i = 0; i < MODEL_OUTPUT_COUNT; i++) {
    const EValue& output = method->get_output(i);
    if (!output.isTensor() || output.toTensor().nbytes() != output_bytes[i]) {
      return MODEL_ERROR_IO;
    }
    std::memcpy(outputs[i], output.toTensor().const_data_ptr(), output_bytes[i]);
  }
  return MODEL_OK;
}

extern "C" size_t model_method_pool_used(void) {
  return method_allocator != nullptr ? method_allocator->used_size() : 0;
}
