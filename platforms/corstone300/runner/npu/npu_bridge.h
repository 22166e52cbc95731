/*
 * The NPU bridge protocol between the runner firmware on QEMU and the host (mirrored in
 * platforms/qemu_npu_bridge.py). QEMU models no Ethos-U, so each command stream the real
 * Ethos-U core driver starts is handed to the host over semihosting: the firmware writes a
 * request to the host file NPU_BRIDGE_REQUEST (a FIFO the harness created in QEMU's working
 * folder) and closes it, then opens NPU_BRIDGE_REPLY and reads the reply. All fields are
 * little-endian uint32.
 *
 * request: magic "ONPQ", version, sequence (1, 2, ... per run), payload_bytes (the custom-operator
 *          payload given to ethosu_invoke_v3: COP1 header, driver actions, commands),
 *          stream_offset and stream_words (the command stream the driver started, within the
 *          payload), region_count, region_count x region size; then the payload bytes, then each
 *          region's bytes (base address 0 = weights, 1 = scratch with the IO, 2 = fast scratch).
 * reply:   magic "ONPR", version, the request's sequence, status (0: the NPU finished; else it
 *          faulted), region_count, region_count x bytes written back (0 for a region the NPU
 *          does not write; otherwise the region's whole size); then those regions' bytes.
 */
#ifndef ORCHESTRATE_RUNNER_NPU_BRIDGE_H
#define ORCHESTRATE_RUNNER_NPU_BRIDGE_H

#define NPU_BRIDGE_REQUEST_MAGIC 0x51504E4Fu /* "ONPQ" */
#define NPU_BRIDGE_REPLY_MAGIC 0x52504E4Fu   /* "ONPR" */
#define NPU_BRIDGE_VERSION 1u
#define NPU_BRIDGE_REQUEST "orchestrate-npu-req"
#define NPU_BRIDGE_REPLY "orchestrate-npu-rep"
#define NPU_BRIDGE_MAX_REGIONS 8

#endif
