/*
 * ExecuTorch's EthosUBackend keeps one ExecutionHandle per NPU partition, made with
 * `new (std::nothrow)` when the method loads (backends/arm/runtime/EthosUBackend.cpp). An
 * `orchestrate firmware` project has no heap, so that form of new takes its bytes from a static
 * pool sized for the program's partitions (MODEL_NPU_HANDLE_POOL_BYTES, model_io.h) and returns
 * nullptr when it is spent, which the backend reports as MemoryAllocationFailed. Nothing is
 * freed before the program ends, so delete releases nothing.
 */
#include <cstddef>
#include <cstdint>
#include <new>

#include "model_io.h"

namespace {
alignas(16) unsigned char handle_pool[MODEL_NPU_HANDLE_POOL_BYTES];
std::size_t handle_pool_used = 0;
}  // namespace

void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  const std::size_t rounded = (size + 15u) & ~static_cast<std::size_t>(15u);
  if (rounded > sizeof(handle_pool) - handle_pool_used) {
    return nullptr;
  }
  void* block = handle_pool + handle_pool_used;
  handle_pool_used += rounded;
  return block;
}

void operator delete(void*) noexcept {}

void operator delete(void*, std::size_t) noexcept {}
