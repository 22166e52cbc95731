/*
 * Reset and fault handling for every Cortex-M the runner is built for (the Corstone-300's M55
 * and the QEMU machines of platforms/qemu_machines/: M3, M4, M7, M33, M55): vector table, memory
 * initialisation, FPU/MVE enable, C/C++ constructors, and a fault report on the console. What a
 * core lacks is left out by the architecture GCC predefines from its -mcpu: the stack limit
 * register and the SecureFault/SAU registers (Armv8-M only), the FPU enable (cores without one),
 * the IT block of the fault handler (Armv6-M and Armv8-M Baseline have none).
 *
 * On the Corstone-300 and the AN505 the CPU resets in Secure state with the SAU off, so every
 * address is Secure and the firmware links at the secure aliases; the Armv7-M machines have no
 * security. The core boots from the vector table at the boot region's start (QEMU's reset VTOR
 * for the machine), which is where the linker script puts .vectors.
 */
#include <stdint.h>
#include <string.h>

#include "board.h"

#define REG32(address) (*(volatile uint32_t*)(address))
#define SCB_CPACR 0xE000ED88u
#define SCB_VTOR 0xE000ED08u
#define SCB_ICSR 0xE000ED04u
#define SCB_SHCSR 0xE000ED24u
#define SCB_CFSR 0xE000ED28u
#define SCB_HFSR 0xE000ED2Cu
#define SCB_MMFAR 0xE000ED34u
#define SCB_BFAR 0xE000ED38u
#define SAU_SFSR 0xE000EDE4u
#define SAU_SFAR 0xE000EDE8u

#if __ARM_ARCH >= 8 && defined(__ARM_ARCH_ISA_THUMB) && __ARM_ARCH_ISA_THUMB == 2
#define RUNNER_ARMV8M_MAINLINE 1 /* MSPLIM, SecureFault, the SAU's fault registers */
#endif
#if __ARM_ARCH_ISA_THUMB == 2
#define RUNNER_HAS_SHCSR_FAULTS 1 /* MemManage, BusFault, UsageFault: Armv7-M and Mainline */
#endif

extern uint32_t __stack_top[];
extern uint32_t __stack_limit[];
extern uint32_t __data_load[];
extern uint32_t __data_start[];
extern uint32_t __data_end[];
extern uint32_t __bss_start[];
extern uint32_t __bss_end[];

extern void __libc_init_array(void);
extern void exit(int code) __attribute__((noreturn));

void Reset_Handler(void);
void Fault_Handler(void);
void Default_Handler(void);
void SysTick_Handler(void);

/* The C runtime calls these around the constructor tables; nothing to do without crti/crtn. */
void _init(void) {}
void _fini(void) {}

/* C++ registers the destructors of static objects against this handle (crtbegin.o defines it
 * in a hosted build; the firmware links without the start files). */
void* __dso_handle = 0;

typedef void (*vector_t)(void);

/* Only the system exceptions: the runner enables no external interrupt. */
__attribute__((section(".vectors"), used)) const vector_t runner_vectors[16] = {
    (vector_t)__stack_top, /* initial MSP */
    Reset_Handler,
    Fault_Handler, /* NMI */
    Fault_Handler, /* HardFault */
    Fault_Handler, /* MemManage */
    Fault_Handler, /* BusFault */
    Fault_Handler, /* UsageFault */
    Fault_Handler, /* SecureFault */
    0,
    0,
    0,
    Default_Handler, /* SVCall */
    Default_Handler, /* DebugMonitor */
    0,
    Default_Handler, /* PendSV */
    SysTick_Handler,
};

__attribute__((noreturn)) void Reset_Handler(void) {
  REG32(SCB_VTOR) = (uint32_t)runner_vectors;
#ifdef RUNNER_ARMV8M_MAINLINE
  /* A stack overflow faults (UsageFault STKOF) instead of corrupting .bss below the stack. */
  __asm__ volatile("msr msplim, %0" : : "r"(__stack_limit));
#endif
#if defined(__ARM_FP) || defined(__ARM_FEATURE_MVE)
  /* CP10/CP11 full access: the FPU and MVE (Helium) share these enables on Armv8.1-M. */
  REG32(SCB_CPACR) |= (0xFu << 20);
#endif
  __asm__ volatile("dsb\n isb" ::: "memory");
#ifdef RUNNER_ARMV8M_MAINLINE
  /* MemManage, BusFault, UsageFault and SecureFault report themselves, not as HardFault. */
  REG32(SCB_SHCSR) |= (1u << 16) | (1u << 17) | (1u << 18) | (1u << 19);
#elif defined(RUNNER_HAS_SHCSR_FAULTS)
  REG32(SCB_SHCSR) |= (1u << 16) | (1u << 17) | (1u << 18);
#endif

  size_t data_bytes = (size_t)((uint8_t*)__data_end - (uint8_t*)__data_start);
  if (__data_load != __data_start) {
    memcpy(__data_start, __data_load, data_bytes);
  }
  memset(__bss_start, 0, (size_t)((uint8_t*)__bss_end - (uint8_t*)__bss_start));

  counters_init();
  __libc_init_array();
  exit(main());
}

/* By hand, not snprintf: a release firmware links no printf. */
static void print_hex(const char* name, uint32_t value) {
  static const char digits[] = "0123456789abcdef";
  char text[11] = {'0', 'x'};
  for (int i = 0; i < 8; i++) {
    text[2 + i] = digits[(value >> (28 - 4 * i)) & 0xFu];
  }
  text[10] = '\0';
  sh_print(" ");
  sh_print(name);
  sh_print("=");
  sh_print(text);
}

/* Called with the exception stack frame (r0-r3, r12, lr, pc, xpsr). */
__attribute__((used, noreturn)) void runner_fault_report(const uint32_t* frame) {
  static const char* const names[] = {"Thread", "Reset", "NMI", "HardFault", "MemManage",
                                      "BusFault", "UsageFault", "SecureFault"};
  uint32_t exception = REG32(SCB_ICSR) & 0x1FFu;
  sh_print("F [executorch:startup.c] CPU fault: ");
  sh_print(exception < 8 ? names[exception] : "exception");
  print_hex("PC", frame[6]);
  print_hex("LR", frame[5]);
#ifdef RUNNER_HAS_SHCSR_FAULTS
  print_hex("CFSR", REG32(SCB_CFSR));
  print_hex("HFSR", REG32(SCB_HFSR));
  print_hex("MMFAR", REG32(SCB_MMFAR));
  print_hex("BFAR", REG32(SCB_BFAR));
#endif
#ifdef RUNNER_ARMV8M_MAINLINE
  print_hex("SFSR", REG32(SAU_SFSR));
  print_hex("SFAR", REG32(SAU_SFAR));
#endif
  sh_print("\n");
  sh_exit(RUNNER_EXIT_FAULT);
}

__attribute__((naked)) void Fault_Handler(void) {
#if __ARM_ARCH_ISA_THUMB == 2
  __asm__ volatile(
      "tst lr, #4\n"
      "ite eq\n"
      "mrseq r0, msp\n"
      "mrsne r0, psp\n"
      "b runner_fault_report\n");
#else
  /* No IT block and no TST immediate on Armv6-M / Armv8-M Baseline; GCC hands Thumb-1 inline
   * assembly over in divided syntax. */
  __asm__ volatile(
      ".syntax unified\n"
      "movs r0, #4\n"
      "mov r1, lr\n"
      "tst r0, r1\n"
      "bne 1f\n"
      "mrs r0, msp\n"
      "b 2f\n"
      "1: mrs r0, psp\n"
      "2: ldr r1, =runner_fault_report\n"
      "bx r1\n"
      ".syntax divided\n");
#endif
}

void Default_Handler(void) {
  sh_print("F [executorch:startup.c] unexpected exception\n");
  sh_exit(RUNNER_EXIT_FAULT);
}
