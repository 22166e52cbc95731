/*
 * Board support shared by the runner's C and C++ files: the semihosting console, the counters,
 * the memory regions the linker script leaves free, and the mailbox through which the harness
 * tells the firmware where the program image lies.
 *
 * The harness (platforms/qemu.py) writes the mailbox and the image into memory before the CPU
 * starts (QEMU `-device loader`, or the FVP's `--data FILE@ADDRESS`), so one firmware ELF runs any
 * program whose operators it registers.
 */
#ifndef ORCHESTRATE_RUNNER_BOARD_H
#define ORCHESTRATE_RUNNER_BOARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes the harness reads (semihosting SYS_EXIT_EXTENDED); away from 1, which QEMU itself
 * returns when it cannot start. Mirrored in platforms/runner_protocol.py (EXIT_MEANING). */
enum runner_exit_code {
  RUNNER_EXIT_PASS = 0,       /* every bundled test case matched (or a plain .pte ran) */
  RUNNER_EXIT_MISMATCH = 10,  /* at least one output differed from the bundled expectation */
  RUNNER_EXIT_ERROR = 11,     /* the program could not be loaded or run */
  RUNNER_EXIT_FAULT = 12,     /* a CPU fault (HardFault, BusFault, ...) */
  RUNNER_EXIT_ABORT = 13,     /* ExecuTorch aborted (ET_CHECK failed, et_pal_abort) */
};

/* "ORUN" little-endian: the harness wrote a mailbox. */
#define RUNNER_MAILBOX_MAGIC 0x4E55524Fu
#define RUNNER_MAILBOX_VERSION 4u
#define RUNNER_REGION_NAME_BYTES 16
/* Planned buffers (ExecuTorch mem_ids 1..N) the mailbox can place one by one. */
#define RUNNER_MAILBOX_PLANNED 4

/* Written by the harness at the linker symbol __runner_mailbox; layout mirrored in
 * platforms/runner_protocol.py (MAILBOX). All fields little-endian, names NUL-padded. */
typedef struct {
  uint32_t magic;
  uint32_t version;
  uint32_t image_address;  /* the .bpte or .pte */
  uint32_t image_bytes;
  /* The region of each memory-planned buffer: entry i holds ExecuTorch's mem_id i + 1. A buffer
   * without an entry (empty name, or beyond RUNNER_MAILBOX_PLANNED) goes to entry 0's region. */
  char planned_regions[RUNNER_MAILBOX_PLANNED][RUNNER_REGION_NAME_BYTES];
  char runtime_region[RUNNER_REGION_NAME_BYTES];  /* method and temp allocators */
  float rtol;              /* BundleIO tolerances; 0 and 0 compare exactly */
  float atol;
  uint32_t repeats;        /* inferences per test case; the counters report each */
  /* Where the plan put the CPU weights (the program's constant segment): the runner copies the
   * segment into this region's free part before the method loads. Empty: they stay in the image. */
  char weights_region[RUNNER_REGION_NAME_BYTES];
  /* The Ethos-U fast scratch (base address 2) the runner sets aside in the runtime region for
   * an NPU build: Vela's arena cache in Dedicated_Sram mode, 0 in Shared_Sram. */
  uint32_t npu_fast_scratch_bytes;
} runner_mailbox_t;

extern volatile runner_mailbox_t __runner_mailbox;

/* A memory region of the platform YAML, with the part the firmware image does not use. */
typedef struct {
  const char* name;
  uint8_t* free_start;
  uint8_t* free_end;
} runner_region_t;

/* Generated from the platform YAML with the linker script (regions.c in the build folder). */
extern const runner_region_t runner_regions[];
extern const unsigned runner_region_count;

/* Semihosting console and exit (semihosting.c). */
void sh_write(const char* text, size_t length);
void sh_print(const char* text);
__attribute__((noreturn)) void sh_exit(int code);
/* Host files (the NPU bridge): SYS_OPEN with an ISO C mode number (0 "r", 1 "rb", 4 "w", 5 "wb");
 * a handle, or -1. The transfers return the bytes NOT moved (0: all of them). */
int sh_open(const char* name, int mode);
int sh_close(int handle);
size_t sh_write_all(int handle, const void* data, size_t length);
size_t sh_read_all(int handle, void* data, size_t length);

/* Counters (counters.c). SysTick runs from the CPU clock; under QEMU `-icount shift=0` its ticks
 * advance with executed instructions (1 ns of virtual time per instruction), and
 * counters_calibrate() measures how many instructions one tick is. */
void counters_init(void);
uint64_t counters_ticks(void);
int counters_have_cycle_counter(void); /* DWT CYCCNT present and counting */
uint32_t counters_cycles(void);
void counters_calibrate(uint32_t* instructions, uint64_t* ticks);

/* The NPU build's setup (npu/ethosu_bridge.c): initialise the Ethos-U driver with the fast
 * scratch; 0 on success. runner.cpp has a weak stand-in for the CPU-only build. */
int runner_npu_setup(uint8_t* fast_scratch, size_t fast_scratch_bytes);

/* Provided by runner.cpp. */
int main(void);

#ifdef __cplusplus
}
#endif

#endif /* ORCHESTRATE_RUNNER_BOARD_H */
