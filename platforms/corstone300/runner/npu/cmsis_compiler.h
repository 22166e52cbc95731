/*
 * The two CMSIS-Core intrinsics the Ethos-U core driver (ethosu_driver.c, its bare-metal
 * semaphore) uses, for the runner's NPU build: CMSIS-Core itself is not among the third-party
 * sources. Written here, not copied; same meaning as CMSIS's __WFE/__SEV.
 */
#ifndef ORCHESTRATE_RUNNER_CMSIS_COMPILER_H
#define ORCHESTRATE_RUNNER_CMSIS_COMPILER_H

#define __WFE() __asm volatile("wfe")
#define __SEV() __asm volatile("sev")

#endif
