/*
 * The Ethos-U device layer of the runner's NPU build on QEMU, which models no Ethos-U.
 *
 * The firmware links ExecuTorch's real EthosUBackend (EthosUBackend.cpp,
 * EthosUBackend_Cortex_M.cpp, ...) and the real Ethos-U core driver (ethosu_driver.c: the
 * custom-operator payload parsing, OPTIMIZER_CONFIG and COMMAND_STREAM actions, alignment
 * checks, power requests, the job state machine and the semaphore wait). Only the driver's
 * lowest layer, the `ethosu_dev_*` functions of ethosu_device_u55_u65.c (ethosu_device_u85.c
 * for the Corstone-320's Ethos-U85; the interface, ethosu_device.h, is the same) that write the
 * NPU's registers and read its interrupt status, is replaced by this file: where the real
 * ethosu_dev_run_command_stream writes QBASE/BASEP and CMD to start the NPU, this one hands the
 * invocation to the host over semihosting (npu_bridge.h), waits for the reply, writes the
 * regions the NPU wrote back into the firmware's memory, and raises the driver's interrupt
 * handler as the NPU would on finishing. The host runs the command stream in the project's
 * Ethos-U55/U65 functional model (platforms/qemu_npu_bridge.py); an Ethos-U85 invocation, whose
 * command stream is not modelled, is computed from the partition's TOSA graph on the inputs
 * this firmware's EthosUBackend copied in.
 *
 * What this layer does not check, the host does: ethosu_dev_verify_optimizer_config accepts
 * every OPTIMIZER_CONFIG here, and the host's functional model refuses a stream compiled for
 * another NPU configuration (npu_driver.ethos_u.resolve_accelerator), which fails the invoke.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "board.h"
#include "ethosu_device.h"
#include "ethosu_driver.h"
#include "npu_bridge.h"

/* EthosUBackend_Internal.h: the fast scratch (base address 2) the backend passes the driver. */
unsigned char* ethosu_fast_scratch = NULL;
size_t ethosu_fast_scratch_size = 0;

/* The platform's NPU register block, from its firmware.yaml (npu.base_address, passed as
 * -DRUNNER_NPU_BASE_ADDRESS): no device answers there on QEMU, and nothing in this layer
 * touches it. */
#ifndef RUNNER_NPU_BASE_ADDRESS
#error "RUNNER_NPU_BASE_ADDRESS: the build passes the platform's NPU base address"
#endif
#define RUNNER_NPU_REGISTERS ((void*)(uintptr_t)(RUNNER_NPU_BASE_ADDRESS))

static struct ethosu_driver runner_driver;
static struct ethosu_driver* current_driver = NULL; /* the job in flight (inference_begin) */
static uint32_t bridge_sequence = 0;
static bool bridge_ok = false;
static char bridge_error[160];

static void bridge_log(const char* text) {
  sh_print("E [npu_bridge] ");
  sh_print(text);
  sh_print("\n");
}

int runner_npu_setup(uint8_t* fast_scratch, size_t fast_scratch_bytes) {
  ethosu_fast_scratch = fast_scratch;
  ethosu_fast_scratch_size = fast_scratch_bytes;
  /* What the Arm executor runner does at boot: one driver for the one NPU. */
  return ethosu_init(&runner_driver, RUNNER_NPU_REGISTERS, fast_scratch, fast_scratch_bytes,
                     1, 1);
}

/* The driver calls this just before ethosu_dev_run_command_stream: the job, with the whole
 * payload and the base addresses, which the device layer's signature does not carry. */
void ethosu_inference_begin(struct ethosu_driver* drv, void* user_arg) {
  (void)user_arg;
  current_driver = drv;
}

void ethosu_inference_end(struct ethosu_driver* drv, void* user_arg) {
  (void)drv;
  (void)user_arg;
  current_driver = NULL;
}

bool ethosu_dev_init(struct ethosu_device* dev, void* base_address, uint32_t secure_enable,
                     uint32_t privilege_enable) {
  dev->reg = (volatile struct NPU_REG*)base_address;
  dev->secure = secure_enable;
  dev->privileged = privilege_enable;
  return true;
}

enum ethosu_error_codes ethosu_dev_axi_init(struct ethosu_device* dev) {
  (void)dev;
  return ETHOSU_SUCCESS;
}

static bool write_all(int handle, const void* data, size_t bytes) {
  return sh_write_all(handle, data, bytes) == 0;
}

/* One request and its reply; false (bridge_error says why) when the exchange fails or the
 * reply is refused. */
static bool exchange(const struct ethosu_job* job, const uint8_t* stream, uint32_t stream_bytes,
                     const uint64_t* base_addr, int num_base_addr) {
  if (num_base_addr < 0 || num_base_addr > NPU_BRIDGE_MAX_REGIONS) {
    snprintf(bridge_error, sizeof bridge_error, "%d base addresses; the bridge carries at most %d",
             num_base_addr, NPU_BRIDGE_MAX_REGIONS);
    return false;
  }
  const uint8_t* payload = (const uint8_t*)job->custom_data_ptr;
  const uint32_t sequence = ++bridge_sequence;
  uint32_t header[7 + NPU_BRIDGE_MAX_REGIONS];
  header[0] = NPU_BRIDGE_REQUEST_MAGIC;
  header[1] = NPU_BRIDGE_VERSION;
  header[2] = sequence;
  header[3] = (uint32_t)job->custom_data_size;
  header[4] = (uint32_t)(stream - payload);
  header[5] = stream_bytes / 4u;
  header[6] = (uint32_t)num_base_addr;
  for (int i = 0; i < num_base_addr; i++) {
    header[7 + i] = (uint32_t)job->base_addr_size[i];
  }
  int request = sh_open(NPU_BRIDGE_REQUEST, 5 /* "wb" */);
  if (request < 0) {
    snprintf(bridge_error, sizeof bridge_error,
             "cannot open the host's %s (no NPU bridge is serving this run)", NPU_BRIDGE_REQUEST);
    return false;
  }
  bool sent = write_all(request, header, (size_t)(7 + num_base_addr) * 4u) &&
              write_all(request, payload, (size_t)job->custom_data_size);
  for (int i = 0; sent && i < num_base_addr; i++) {
    if (job->base_addr_size[i] != 0) {
      sent = write_all(request, (const void*)(uintptr_t)base_addr[i], job->base_addr_size[i]);
    }
  }
  sh_close(request);
  if (!sent) {
    snprintf(bridge_error, sizeof bridge_error, "writing request %" PRIu32 " failed", sequence);
    return false;
  }

  int reply = sh_open(NPU_BRIDGE_REPLY, 1 /* "rb" */);
  if (reply < 0) {
    snprintf(bridge_error, sizeof bridge_error, "cannot open the host's %s", NPU_BRIDGE_REPLY);
    return false;
  }
  uint32_t head[5];
  uint32_t written[NPU_BRIDGE_MAX_REGIONS];
  bool ok = false;
  if (sh_read_all(reply, head, sizeof head) != 0) {
    snprintf(bridge_error, sizeof bridge_error, "reply to request %" PRIu32 " is truncated",
             sequence);
  } else if (head[0] != NPU_BRIDGE_REPLY_MAGIC || head[1] != NPU_BRIDGE_VERSION) {
    snprintf(bridge_error, sizeof bridge_error,
             "reply refused: magic 0x%08" PRIx32 " version %" PRIu32 " (expected 0x%08" PRIx32
             " version %" PRIu32 ")",
             head[0], head[1], (uint32_t)NPU_BRIDGE_REPLY_MAGIC, (uint32_t)NPU_BRIDGE_VERSION);
  } else if (head[2] != sequence) {
    snprintf(bridge_error, sizeof bridge_error,
             "reply refused: it answers request %" PRIu32 ", not %" PRIu32 " (stale or foreign)",
             head[2], sequence);
  } else if (head[3] != 0) {
    snprintf(bridge_error, sizeof bridge_error,
             "the host's NPU model reports status %" PRIu32 " for request %" PRIu32
             " (the host's log says why)", head[3], sequence);
  } else if (head[4] != (uint32_t)num_base_addr ||
             sh_read_all(reply, written, head[4] * 4u) != 0) {
    snprintf(bridge_error, sizeof bridge_error, "reply refused: %" PRIu32 " regions, sent %d",
             head[4], num_base_addr);
  } else {
    ok = true;
    for (int i = 0; ok && i < num_base_addr; i++) {
      if (written[i] != 0 && (i == 0 || written[i] != job->base_addr_size[i])) {
        snprintf(bridge_error, sizeof bridge_error,
                 "reply refused: region %d comes back with %" PRIu32 " bytes (%s)", i, written[i],
                 i == 0 ? "the weights are read-only" : "not the region's size");
        ok = false;
      }
    }
    /* Only now, the header accepted, does the NPU's output land in the firmware's memory. */
    for (int i = 0; ok && i < num_base_addr; i++) {
      if (written[i] != 0 &&
          sh_read_all(reply, (void*)(uintptr_t)base_addr[i], written[i]) != 0) {
        snprintf(bridge_error, sizeof bridge_error, "reply to request %" PRIu32
                 " is truncated in region %d", sequence, i);
        ok = false;
      }
    }
  }
  sh_close(reply);
  return ok;
}

void ethosu_dev_run_command_stream(struct ethosu_device* dev, const uint8_t* cmd_stream_ptr,
                                   uint32_t cms_length, const uint64_t* base_addr,
                                   int num_base_addr) {
  (void)dev;
  struct ethosu_driver* drv = current_driver;
  bridge_error[0] = '\0';
  if (drv == NULL) {
    snprintf(bridge_error, sizeof bridge_error, "a command stream started outside a job");
    bridge_ok = false;
    bridge_log(bridge_error);
    return;
  }
  bridge_ok = exchange(&drv->job, cmd_stream_ptr, cms_length, base_addr, num_base_addr);
  if (!bridge_ok) {
    bridge_log(bridge_error);
  }
  /* The NPU's interrupt: the command stream has stopped (or faulted). */
  ethosu_irq_handler(drv);
}

void ethosu_dev_print_err_status(struct ethosu_device* dev) {
  (void)dev;
  fprintf(stderr, "E: NPU bridge: %s\n", bridge_error[0] ? bridge_error : "NPU fault");
}

bool ethosu_dev_handle_interrupt(struct ethosu_device* dev) {
  (void)dev;
  return bridge_ok;
}

bool ethosu_dev_verify_access_state(struct ethosu_device* dev) {
  (void)dev;
  return true;
}

enum ethosu_error_codes ethosu_dev_soft_reset(struct ethosu_device* dev) {
  (void)dev;
  return ETHOSU_SUCCESS;
}

void ethosu_dev_get_hw_info(struct ethosu_device* dev, struct ethosu_hw_info* hwinfo) {
  (void)dev;
  memset(hwinfo, 0, sizeof *hwinfo);
}

enum ethosu_error_codes ethosu_dev_set_clock_and_power(struct ethosu_device* dev,
                                                       enum ethosu_clock_q_request clock_q,
                                                       enum ethosu_power_q_request power_q) {
  (void)dev;
  (void)clock_q;
  (void)power_q;
  return ETHOSU_SUCCESS;
}

bool ethosu_dev_verify_optimizer_config(struct ethosu_device* dev, uint32_t cfg_in,
                                        uint32_t id_in) {
  (void)dev;
  (void)cfg_in;
  (void)id_in;
  return true; /* checked by the host's functional model (see the top of this file) */
}
