/*
 * Counters for the figures the runner reports.
 *
 * SysTick counts down from the CPU clock; its 24-bit wraps are counted in SysTick_Handler to make
 * a 64-bit tick count. On silicon and on the FVP a tick is a CPU clock cycle. Under QEMU there
 * is no cycle model: with `-icount shift=0` virtual time advances 1 ns per executed instruction,
 * and SysTick ticks at the machine's 32 MHz in that virtual time, so a tick is 31.25 instructions.
 * counters_calibrate() measures that ratio on a loop of known length instead of assuming it.
 *
 * The DWT cycle counter is used where it counts (silicon, FVP); QEMU 7.2 does not implement the
 * DWT (its registers read as zero), which counters_have_cycle_counter() detects.
 */
#include <stdint.h>

#include "board.h"

#define REG32(address) (*(volatile uint32_t*)(address))
#define SYST_CSR 0xE000E010u
#define SYST_RVR 0xE000E014u
#define SYST_CVR 0xE000E018u
#define DEMCR 0xE000EDFCu
#define DWT_CTRL 0xE0001000u
#define DWT_CYCCNT 0xE0001004u

#define SYSTICK_RELOAD 0x00FFFFFFu

static volatile uint32_t systick_wraps;
static int cycle_counter_works;

void SysTick_Handler(void) {
  systick_wraps++;
}

void counters_init(void) {
  REG32(SYST_RVR) = SYSTICK_RELOAD;
  REG32(SYST_CVR) = 0;
  /* CLKSOURCE = processor clock, TICKINT, ENABLE */
  REG32(SYST_CSR) = 0x7u;

  REG32(DEMCR) |= (1u << 24); /* TRCENA */
  uint32_t control = REG32(DWT_CTRL);
  if (control != 0 && (control & (1u << 25)) == 0) { /* a DWT without NOCYCCNT */
    REG32(DWT_CYCCNT) = 0;
    REG32(DWT_CTRL) = control | 1u; /* CYCCNTENA */
    uint32_t first = REG32(DWT_CYCCNT);
    for (volatile int spin = 0; spin < 16; spin++) {
    }
    cycle_counter_works = REG32(DWT_CYCCNT) != first;
  }
}

uint64_t counters_ticks(void) {
  uint32_t wraps;
  uint32_t current;
  /* A wrap between the two reads is taken as an interrupt at once (interrupts are enabled),
   * so an unchanged wrap count means the pair is consistent. */
  do {
    wraps = systick_wraps;
    current = REG32(SYST_CVR);
  } while (wraps != systick_wraps);
  return (uint64_t)wraps * (SYSTICK_RELOAD + 1u) + (SYSTICK_RELOAD - current);
}

int counters_have_cycle_counter(void) {
  return cycle_counter_works;
}

uint32_t counters_cycles(void) {
  return cycle_counter_works ? REG32(DWT_CYCCNT) : 0u;
}

void counters_calibrate(uint32_t* instructions, uint64_t* ticks) {
  /* Two instructions per iteration (subs, bne): 2 * iterations instructions in all, give or take
   * the few that read the counter. */
  const uint32_t iterations = 1000000u;
  uint32_t remaining = iterations;
  uint64_t start = counters_ticks();
#if __ARM_ARCH_ISA_THUMB == 2
  __asm__ volatile(
      "1: subs %0, %0, #1\n"
      "   bne 1b\n"
      : "+r"(remaining)
      :
      : "cc");
#else
  /* GCC hands Thumb-1 inline assembly (Armv6-M, Armv8-M Baseline) over in divided syntax. */
  __asm__ volatile(
      ".syntax unified\n"
      "1: subs %0, %0, #1\n"
      "   bne 1b\n"
      ".syntax divided\n"
      : "+l"(remaining)
      :
      : "cc");
#endif
  *ticks = counters_ticks() - start;
  *instructions = 2u * iterations;
}
