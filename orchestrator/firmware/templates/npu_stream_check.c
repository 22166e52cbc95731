/*
 * The command-stream check on the device, in a check-profile firmware: every Ethos-U55/U65/U85
 * invocation is checked before the driver submits it, as the host's checker does
 * (npu_driver/ethos_u/checker.py in orchestrate) and as the Linux `accel/ethosu` driver does
 * for a user's stream (ethosu_gem.c::ethosu_gem_cmdstream_copy_and_validate).
 *
 * The link wraps ethosu_invoke_v3 (-Wl,--wrap=ethosu_invoke_v3): ExecuTorch's EthosUBackend
 * calls it with the custom-operator payload (COP1) and the base addresses and sizes of the
 * regions (0 the weights, 1 the scratch, 2 the fast scratch). For each COMMAND_STREAM of the
 * payload the registers are replayed and, at each command that starts an operation, the bytes
 * it reaches are derived and bounded by its region's size:
 *
 *   IFM   the extent the OFM size, kernel, stride, dilation, padding and upscaling imply;
 *         an elementwise IFM is the OFM's shape
 *   IFM2  the OFM's shape with the broadcast dimensions at 1 (none for a scalar or unary op)
 *   OFM   its shape, through its four tiles, strides and layout (NHWC or NHCWB16)
 *   weights and scales: WEIGHT_BASE/LENGTH, SCALE_BASE/LENGTH (no scales with a global scale)
 *   DMA   source and destination, SHRAM for an internal end
 *
 * and every register an operation reads must have been set, and the stream must end with
 * NPU_OP_STOP. A refused stream is logged on the console in the host checker's words, naming
 * the command and its word offset in the payload ("E [npu_check] NPU_OP_CONV at word 81: OFM
 * reaches bytes 15936..23935 of region 1, which has 16000 bytes"), and the invocation fails
 * without the NPU being started. Reserved bits are checked on the host only.
 *
 * The Ethos-U85 (ETHOSU85, its own command table) as the host's u85_checker.py: a CHAINED or NONE
 * feature map touches no memory, a transposed OFM is bounded in the transpose's order, weights
 * from IFM2 are a 1 x OFM depth x IFM depth map, WEIGHT1-3 are bounded beside WEIGHT, an
 * elementwise IFM has its own broadcast, pooling NONE reads no IFM, a resize reads a
 * KERNEL_HEIGHT x KERNEL_WIDTH IFM, a gather DMA its indices and the rows up to IDX_MAX. What
 * the check cannot bound (a TILE3X1 map, NPU_OP_BRANCH, other indexed or internal DMA, a 2-D/3-D
 * DMA) is let
 * through with one "W [npu_check] ... is not bounded by this check" line.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ethosu_driver.h"

#define NPU_DISASSEMBLE /* the opcode name tables */
#if defined(ETHOSU85)
#include "ethosu85_interface.h"
#elif defined(ETHOSU65)
#include "ethosu65_interface.h"
#else
#include "ethosu55_interface.h"
#endif

void sh_print(const char* text); /* board/semihosting.c */

int __real_ethosu_invoke_v3(struct ethosu_driver* drv, const void* custom_data_ptr,
                            const int custom_data_size, uint64_t* const base_addr,
                            const size_t* base_addr_size, const int num_base_addr,
                            void* user_arg);

#define COP1_FOURCC 0x31504F43u
#define ACTION_OPTIMIZER_CONFIG 1u
#define ACTION_COMMAND_STREAM 2u
#define ACTION_NOP 5u
#define CMD0_COUNT (sizeof(cmd0_opcode_str) / sizeof(cmd0_opcode_str[0]))
#define CMD1_COUNT (sizeof(cmd1_opcode_str) / sizeof(cmd1_opcode_str[0]))
#define SHRAM_REGION (-1)
#define SCALE_RECORD_BYTES 10

typedef struct {
  const uint32_t* words;
  uint32_t op_offset; /* the operation's word offset in the payload */
  unsigned op_code;
  const char* op_name;
  const size_t* sizes;
  const bool* present;
  int regions;
  int64_t shram_bytes;
  uint16_t cmd0[CMD0_COUNT];
  uint8_t cmd0_set[(CMD0_COUNT + 7) / 8];
  uint16_t cmd1_param[CMD1_COUNT];
  uint32_t cmd1_payload[CMD1_COUNT];
  uint8_t cmd1_set[(CMD1_COUNT + 7) / 8];
  char message[200];
} check_t;

static check_t check_state; /* one invocation at a time: the driver's semaphore */

static const char* strip(const char* name, size_t prefix) {
  return name + prefix; /* "CMD0_OPCODE_NPU_OP_CONV" -> "NPU_OP_CONV" */
}

static bool known(const char* name) {
  return name != NULL && name[0] == 'C';
}

/* What the check cannot bound it lets through, saying so once per invocation. */
static bool not_bounded(check_t* c, const char* what) {
  char line[200];
  snprintf(line, sizeof(line), "W [npu_check] %s at word %lu: %s is not bounded by this check\n",
           c->op_name, (unsigned long)c->op_offset, what);
  sh_print(line);
  return true;
}

static bool refuse(check_t* c, const char* text) {
  char line[260];
  (void)c;
  snprintf(line, sizeof(line), "E [npu_check] %s\n", text);
  sh_print(line);
  return false;
}

/* The register values, each refused when the stream never set it. */
static bool reg0(check_t* c, unsigned opcode, uint32_t* out) {
  if (opcode >= CMD0_COUNT || !(c->cmd0_set[opcode / 8] & (1u << (opcode % 8)))) {
    snprintf(c->message, sizeof(c->message), "%s at word %lu reads %s, which the command stream "
             "never set", c->op_name, (unsigned long)c->op_offset,
             opcode < CMD0_COUNT ? strip(cmd0_opcode_str[opcode], 12) : "?");
    return refuse(c, c->message);
  }
  *out = c->cmd0[opcode];
  return true;
}

static bool reg1(check_t* c, unsigned opcode, uint32_t* payload, int64_t* address) {
  if (opcode >= CMD1_COUNT || !(c->cmd1_set[opcode / 8] & (1u << (opcode % 8)))) {
    snprintf(c->message, sizeof(c->message), "%s at word %lu reads %s, which the command stream "
             "never set", c->op_name, (unsigned long)c->op_offset,
             opcode < CMD1_COUNT ? strip(cmd1_opcode_str[opcode], 12) : "?");
    return refuse(c, c->message);
  }
  if (payload) *payload = c->cmd1_payload[opcode];
  /* Ethos-U65 carries address bits 32-39 in the low byte of the parameter. */
  if (address) *address = ((int64_t)(c->cmd1_param[opcode] & 0xFF) << 32) | c->cmd1_payload[opcode];
  return true;
}

static bool access_region(check_t* c, int region, int64_t lowest, int64_t length,
                          const char* what) {
  if (length <= 0) return true;
  int64_t highest = lowest + length - 1;
  int64_t size;
  if (region == SHRAM_REGION) {
    size = c->shram_bytes;
  } else if (region >= c->regions || !c->present[region]) {
    snprintf(c->message, sizeof(c->message), "%s at word %lu: %s in region %d, which has no base "
             "address (the driver set %d)", c->op_name, (unsigned long)c->op_offset, what,
             region, c->regions);
    return refuse(c, c->message);
  } else {
    size = (int64_t)c->sizes[region];
  }
  if (lowest < 0 || highest >= size) {
    char place[16];
    if (region == SHRAM_REGION) snprintf(place, sizeof(place), "SHRAM");
    else snprintf(place, sizeof(place), "region %d", region);
    snprintf(c->message, sizeof(c->message), "%s at word %lu: %s reaches bytes %lld..%lld of %s, "
             "which has %lld bytes", c->op_name, (unsigned long)c->op_offset, what,
             (long long)lowest, (long long)highest, place, (long long)size);
    return refuse(c, c->message);
  }
  return true;
}

static int64_t s32(uint32_t value) {
  return (int64_t)(int32_t)value;
}

static void span(int64_t stride, int64_t first, int64_t last, int64_t* lo, int64_t* hi) {
  /* min and max of i * stride over i in [first, last] */
  int64_t a = first * stride, b = last * stride;
  *lo = a < b ? a : b;
  *hi = a < b ? b : a;
}

/* A feature map (IFM, IFM2 or OFM) of height x width x depth elements through its tiles. */
typedef struct {
  unsigned region, base[4], height0, height1, width0, stride_x, stride_y, stride_c, precision;
} fm_regs_t;

static bool feature_map(check_t* c, const fm_regs_t* r, bool ofm, int64_t height, int64_t width,
                        int64_t depth, const char* what) {
  uint32_t region, h0, h1, w0, precision, sx, sy, sc;
  int64_t base[4];
  if (!reg0(c, r->region, &region) || !reg0(c, r->height0, &h0) || !reg0(c, r->height1, &h1) ||
      !reg0(c, r->width0, &w0) || !reg0(c, r->precision, &precision) ||
      !reg1(c, r->stride_x, &sx, NULL) || !reg1(c, r->stride_y, &sy, NULL) ||
      !reg1(c, r->stride_c, &sc, NULL))
    return false;
  for (int t = 0; t < 4; t++)
    if (!reg1(c, r->base[t], NULL, &base[t])) return false;
#if defined(ETHOSU85)
  /* activation_storage (bits 14-15): a CHAINED map is in the chaining buffer and a NONE map is
   * not written (accumulators kept): no memory access; TILE3X1 is not bounded here. */
  unsigned storage = (precision >> 14) & 0x3;
  if (storage == ACTIVATION_STORAGE_CHAINED || storage == ACTIVATION_STORAGE_NONE) return true;
  if (storage != ACTIVATION_STORAGE_TILE2X2) return not_bounded(c, "a TILE3X1 feature map");
  if (ofm) { /* a transposed OFM is the map of the OFM's H x W x C in the transpose's order */
    int64_t hwc[3] = {height, width, depth}, out[3];
    static const int8_t order[8][3] = {{0, 1, 2}, {1, 0, 2}, {0, 2, 1}, {1, 2, 0},
                                       {-1, -1, -1}, {-1, -1, -1}, {2, 0, 1}, {2, 1, 0}};
    unsigned transpose = (precision >> 11) & 0x7;
    if (order[transpose][0] < 0) {
      snprintf(c->message, sizeof(c->message), "%s at word %lu: OFM transpose %u is a reserved "
               "value", c->op_name, (unsigned long)c->op_offset, transpose);
      return refuse(c, c->message);
    }
    for (int i = 0; i < 3; i++) out[i] = hwc[order[transpose][i]];
    height = out[0];
    width = out[1];
    depth = out[2];
  }
#endif
  unsigned size_code = ofm ? (precision >> 1) & 0x3 : (precision >> 2) & 0x3;
  unsigned layout = (precision >> 6) & 0x3;
  if (size_code == 3 || layout > 1) {
    snprintf(c->message, sizeof(c->message), "%s at word %lu: %s precision %#lx is not NHWC or "
             "NHCWB16 of 8, 16 or 32 bits", c->op_name, (unsigned long)c->op_offset, what,
             (unsigned long)precision);
    return refuse(c, c->message);
  }
  int64_t element = (int64_t)1 << size_code;
  int64_t height0 = (int64_t)h0 + 1, height1 = (int64_t)h1 + 1, width0 = (int64_t)w0 + 1;
  int64_t stride_x = s32(sx), stride_y = s32(sy), stride_c = s32(sc);
  if (height <= 0 || width <= 0 || depth <= 0) return true;
  /* Tiles: 0 top-left, 1 right of 0 (rows below HEIGHT1 go to 3), 2 below 0, 3 below 1. */
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (int tile = 0; tile < 4; tile++) {
    bool right = tile & 1, below = tile & 2;
    int64_t x0 = right ? width0 : 0, x1 = right ? width - 1 : (width < width0 ? width : width0) - 1;
    int64_t split = right ? height1 : height0;
    int64_t y0 = below ? split : 0, y1 = below ? height - 1 : (height < split ? height : split) - 1;
    if (x1 < x0 || y1 < y0) continue;
    int64_t ylo, yhi, xlo, xhi;
    span(stride_y, y0 - (below ? split : 0), y1 - (below ? split : 0), &ylo, &yhi);
    span(stride_x, x0 - (right ? width0 : 0), x1 - (right ? width0 : 0), &xlo, &xhi);
    if (base[tile] + ylo + xlo < lo) lo = base[tile] + ylo + xlo;
    if (base[tile] + yhi + xhi > hi) hi = base[tile] + yhi + xhi;
  }
  /* channel c at (c / 16) * STRIDE_C + (c % 16) * element (NHCWB16), c * element (NHWC) */
  int64_t clo = INT64_MAX, chi = INT64_MIN;
  if (layout == 0) {
    clo = 0;
    chi = (depth - 1) * element;
  } else {
    for (int64_t block = 0; block * 16 < depth; block++) {
      int64_t in_block = depth - block * 16 < 16 ? depth - block * 16 : 16;
      int64_t first = block * stride_c, last = first + (in_block - 1) * element;
      if (first < clo) clo = first;
      if (last > chi) chi = last;
    }
  }
  return access_region(c, (int)(region & 0x7), lo + clo, (hi + chi + element - 1) - (lo + clo) + 1,
                       what);
}

static const fm_regs_t IFM = {
    CMD0_OPCODE_NPU_SET_IFM_REGION,
    {CMD1_OPCODE_NPU_SET_IFM_BASE0, CMD1_OPCODE_NPU_SET_IFM_BASE1, CMD1_OPCODE_NPU_SET_IFM_BASE2,
     CMD1_OPCODE_NPU_SET_IFM_BASE3},
    CMD0_OPCODE_NPU_SET_IFM_HEIGHT0_M1, CMD0_OPCODE_NPU_SET_IFM_HEIGHT1_M1,
    CMD0_OPCODE_NPU_SET_IFM_WIDTH0_M1, CMD1_OPCODE_NPU_SET_IFM_STRIDE_X,
    CMD1_OPCODE_NPU_SET_IFM_STRIDE_Y, CMD1_OPCODE_NPU_SET_IFM_STRIDE_C,
    CMD0_OPCODE_NPU_SET_IFM_PRECISION};
static const fm_regs_t IFM2 = {
    CMD0_OPCODE_NPU_SET_IFM2_REGION,
    {CMD1_OPCODE_NPU_SET_IFM2_BASE0, CMD1_OPCODE_NPU_SET_IFM2_BASE1,
     CMD1_OPCODE_NPU_SET_IFM2_BASE2, CMD1_OPCODE_NPU_SET_IFM2_BASE3},
    CMD0_OPCODE_NPU_SET_IFM2_HEIGHT0_M1, CMD0_OPCODE_NPU_SET_IFM2_HEIGHT1_M1,
    CMD0_OPCODE_NPU_SET_IFM2_WIDTH0_M1, CMD1_OPCODE_NPU_SET_IFM2_STRIDE_X,
    CMD1_OPCODE_NPU_SET_IFM2_STRIDE_Y, CMD1_OPCODE_NPU_SET_IFM2_STRIDE_C,
    CMD0_OPCODE_NPU_SET_IFM2_PRECISION};
static const fm_regs_t OFM = {
    CMD0_OPCODE_NPU_SET_OFM_REGION,
    {CMD1_OPCODE_NPU_SET_OFM_BASE0, CMD1_OPCODE_NPU_SET_OFM_BASE1, CMD1_OPCODE_NPU_SET_OFM_BASE2,
     CMD1_OPCODE_NPU_SET_OFM_BASE3},
    CMD0_OPCODE_NPU_SET_OFM_HEIGHT0_M1, CMD0_OPCODE_NPU_SET_OFM_HEIGHT1_M1,
    CMD0_OPCODE_NPU_SET_OFM_WIDTH0_M1, CMD1_OPCODE_NPU_SET_OFM_STRIDE_X,
    CMD1_OPCODE_NPU_SET_OFM_STRIDE_Y, CMD1_OPCODE_NPU_SET_OFM_STRIDE_C,
    CMD0_OPCODE_NPU_SET_OFM_PRECISION};

static bool ofm_shape(check_t* c, int64_t shape[3]) {
  uint32_t h = 0, w = 0, d = 0;
  if (!reg0(c, CMD0_OPCODE_NPU_SET_OFM_HEIGHT_M1, &h) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_OFM_WIDTH_M1, &w) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_OFM_DEPTH_M1, &d))
    return false;
  shape[0] = (int64_t)h + 1;
  shape[1] = (int64_t)w + 1;
  shape[2] = (int64_t)d + 1;
  return true;
}

/* The IFM a kernel of the OFM implies: (OFM - 1) x stride + dilated kernel - padding. */
static bool ifm_for_kernel(check_t* c, const int64_t ofm[3], int64_t depth) {
  uint32_t stride, kh, kw, top, left, bottom, right, upscale;
  if (!reg0(c, CMD0_OPCODE_NPU_SET_KERNEL_STRIDE, &stride) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_KERNEL_HEIGHT_M1, &kh) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_KERNEL_WIDTH_M1, &kw) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_IFM_PAD_TOP, &top) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_IFM_PAD_LEFT, &left) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_IFM_PAD_BOTTOM, &bottom) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_IFM_PAD_RIGHT, &right) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_IFM_UPSCALE, &upscale))
    return false;
  /* npu_set_kernel_stride_t: stride_x_lsb 0, stride_y_lsb 1, stride_x_msb 6, stride_y_msb 9 */
  int64_t sx = ((stride >> 6) & 1) * 2 + (stride & 1) + 1;
  int64_t sy = ((stride >> 9) & 1) * 2 + ((stride >> 1) & 1) + 1;
  top &= 0x7F;
  left &= 0x7F;
  bottom &= 0xFF;
  right &= 0xFF;
  int64_t height = (ofm[0] - 1) * sy + ((int64_t)kh + 1) - top - bottom;
  int64_t width = (ofm[1] - 1) * sx + ((int64_t)kw + 1) - left - right;
  if (height <= 0 || width <= 0) {
    snprintf(c->message, sizeof(c->message), "%s at word %lu: padding %lu/%lu/%lu/%lu leaves no "
             "IFM for a %lldx%lld OFM", c->op_name, (unsigned long)c->op_offset,
             (unsigned long)top, (unsigned long)left, (unsigned long)bottom,
             (unsigned long)right, (long long)ofm[0], (long long)ofm[1]);
    return refuse(c, c->message);
  }
  if (upscale & 0x3) {
    height = (height + 1) / 2;
    width = (width + 1) / 2;
  }
  return feature_map(c, &IFM, false, height, width, depth, "IFM");
}

static bool scaled(check_t* c, bool* out) {
  uint32_t precision;
  if (!reg0(c, CMD0_OPCODE_NPU_SET_OFM_PRECISION, &precision)) return false;
  *out = !((precision >> 8) & 1); /* per-channel records, not OFM_SCALE */
  return true;
}

static bool stream(check_t* c, bool weights, int64_t channels) {
  uint32_t region, length;
  int64_t base;
  if (!reg0(c, weights ? CMD0_OPCODE_NPU_SET_WEIGHT_REGION : CMD0_OPCODE_NPU_SET_SCALE_REGION,
            &region) ||
      !reg1(c, weights ? CMD1_OPCODE_NPU_SET_WEIGHT_BASE : CMD1_OPCODE_NPU_SET_SCALE_BASE, NULL,
            &base) ||
      !reg1(c, weights ? CMD1_OPCODE_NPU_SET_WEIGHT_LENGTH : CMD1_OPCODE_NPU_SET_SCALE_LENGTH,
            &length, NULL))
    return false;
  if (!weights && (int64_t)length < channels * SCALE_RECORD_BYTES) {
    snprintf(c->message, sizeof(c->message), "%s at word %lu: SCALE_LENGTH %lu holds fewer than "
             "the %lld x 10-byte records the OFM depth needs", c->op_name,
             (unsigned long)c->op_offset, (unsigned long)length, (long long)channels);
    return refuse(c, c->message);
  }
  return access_region(c, (int)(region & 0x7), base, length,
                       weights ? "weight stream" : "scale/bias records");
}

#if defined(ETHOSU85)
/* WEIGHTn_BASE/LENGTH: the stream of weight decoder n, in WEIGHT_REGION, when set. */
static bool extra_weights(check_t* c) {
  static const unsigned regs[3][2] = {
      {CMD1_OPCODE_NPU_SET_WEIGHT1_BASE, CMD1_OPCODE_NPU_SET_WEIGHT1_LENGTH},
      {CMD1_OPCODE_NPU_SET_WEIGHT2_BASE, CMD1_OPCODE_NPU_SET_WEIGHT2_LENGTH},
      {CMD1_OPCODE_NPU_SET_WEIGHT3_BASE, CMD1_OPCODE_NPU_SET_WEIGHT3_LENGTH}};
  static const char* names[3] = {"weight stream 1", "weight stream 2", "weight stream 3"};
  for (int i = 0; i < 3; i++) {
    unsigned length_reg = regs[i][1];
    if (!(c->cmd1_set[length_reg / 8] & (1u << (length_reg % 8)))) continue;
    uint32_t region, length;
    int64_t base;
    if (!reg1(c, length_reg, &length, NULL)) return false;
    if (length == 0) continue;
    if (!reg0(c, CMD0_OPCODE_NPU_SET_WEIGHT_REGION, &region) ||
        !reg1(c, regs[i][0], NULL, &base) ||
        !access_region(c, (int)(region & 0x7), base, length, names[i]))
      return false;
  }
  return true;
}
#endif

static bool op_conv(check_t* c, uint32_t param) {
  int64_t ofm[3];
  uint32_t depth;
  bool per_channel, weights = true;
  if (!ofm_shape(c, ofm) || !reg0(c, CMD0_OPCODE_NPU_SET_IFM_DEPTH_M1, &depth) ||
      !ifm_for_kernel(c, ofm, (int64_t)depth + 1))
    return false;
#if defined(ETHOSU85)
  if (c->op_code == CMD0_OPCODE_NPU_OP_CONV && (param & 1)) {
    /* NPU_OP_CONV weights_ifm2: a 1 x OFM depth x IFM depth map (regor's RewriteMatmul
     * transposes the weights so; element (0, o, i) weighs IFM channel i into OFM channel o) */
    weights = false;
    if (!feature_map(c, &IFM2, false, 1, ofm[2], (int64_t)depth + 1, "IFM2")) return false;
  }
#else
  (void)param;
#endif
  if (!feature_map(c, &OFM, true, ofm[0], ofm[1], ofm[2], "OFM")) return false;
  if (weights && !stream(c, true, ofm[2])) return false;
#if defined(ETHOSU85)
  if (weights && !extra_weights(c)) return false;
#endif
  if (!scaled(c, &per_channel)) return false;
  return !per_channel || stream(c, false, ofm[2]);
}

static bool op_pool(check_t* c, uint32_t param) {
  int64_t ofm[3];
  uint32_t depth;
  bool per_channel, reads_ifm = true;
#if defined(ETHOSU85)
  reads_ifm = (param & 0x7) != POOLING_MODE_NONE;
#else
  (void)param;
#endif
  if (!ofm_shape(c, ofm) || !reg0(c, CMD0_OPCODE_NPU_SET_IFM_DEPTH_M1, &depth) ||
      (reads_ifm && !ifm_for_kernel(c, ofm, (int64_t)depth + 1)) ||
      !feature_map(c, &OFM, true, ofm[0], ofm[1], ofm[2], "OFM") || !scaled(c, &per_channel))
    return false;
  return !per_channel || stream(c, false, ofm[2]);
}

#if defined(ETHOSU85)
/* NPU_OP_RESIZE: an IFM of KERNEL_HEIGHT x KERNEL_WIDTH elements (regor writes the IFM's height
 * and the width the OFM reaches) at the OFM's depth, and the OFM. */
static bool op_resize(check_t* c) {
  int64_t ofm[3];
  uint32_t kh, kw;
  return ofm_shape(c, ofm) && reg0(c, CMD0_OPCODE_NPU_SET_KERNEL_HEIGHT_M1, &kh) &&
         reg0(c, CMD0_OPCODE_NPU_SET_KERNEL_WIDTH_M1, &kw) &&
         feature_map(c, &IFM, false, (int64_t)kh + 1, (int64_t)kw + 1, ofm[2], "IFM") &&
         feature_map(c, &OFM, true, ofm[0], ofm[1], ofm[2], "OFM");
}

static bool op_elementwise(check_t* c, uint32_t param) {
  int64_t ofm[3];
  unsigned mode = param & 0x3F;
  bool unary = mode == ELEMENTWISE_MODE_LRELU || mode == ELEMENTWISE_MODE_ABS ||
               mode == ELEMENTWISE_MODE_CLZ || mode == ELEMENTWISE_MODE_NOT;
  if (!ofm_shape(c, ofm)) return false;
  for (int operand = 0; operand < (unary ? 1 : 2); operand++) {
    uint32_t broadcast;
    if (!reg0(c, operand ? CMD0_OPCODE_NPU_SET_IFM2_BROADCAST : CMD0_OPCODE_NPU_SET_IFM_BROADCAST,
              &broadcast))
      return false;
    broadcast &= 0xF;
    if (broadcast == BROADCAST_MODE_SCALAR) continue; /* a scalar: no feature map read */
    if (!feature_map(c, operand ? &IFM2 : &IFM, false, broadcast & 1 ? 1 : ofm[0],
                     broadcast & 2 ? 1 : ofm[1], broadcast & 4 ? 1 : ofm[2],
                     operand ? "IFM2" : "IFM"))
      return false;
  }
  return feature_map(c, &OFM, true, ofm[0], ofm[1], ofm[2], "OFM");
}
#else
static bool op_elementwise(check_t* c, uint32_t mode) {
  int64_t ofm[3];
  if (!ofm_shape(c, ofm) || !feature_map(c, &IFM, false, ofm[0], ofm[1], ofm[2], "IFM"))
    return false;
  if (mode != 5 && mode != 6 && mode != 7) { /* LRELU, ABS, CLZ: no IFM2 */
    uint32_t broadcast;
    if (!reg0(c, CMD0_OPCODE_NPU_SET_IFM2_BROADCAST, &broadcast)) return false;
    if (!(broadcast & 0x80) &&
        !feature_map(c, &IFM2, false, broadcast & 1 ? 1 : ofm[0], broadcast & 2 ? 1 : ofm[1],
                     broadcast & 4 ? 1 : ofm[2], "IFM2"))
      return false;
  }
  return feature_map(c, &OFM, true, ofm[0], ofm[1], ofm[2], "OFM");
}
#endif

#if defined(ETHOSU85)
/* A 2-D DMA with indexed source rows (regor's GATHER): SIZE0 int32 indices at DMA0_IDX in
 * IDX_REGION, each at most IDX_MAX; row i copied from SRC + index x SRC_STRIDE0 to
 * DST + i x DST_STRIDE0, LEN bytes each. */
static int64_t s40(int64_t value) {
  return value & ((int64_t)1 << 39) ? value - ((int64_t)1 << 40) : value;
}

static bool op_gather(check_t* c, uint32_t src_region, uint32_t dst_region, int64_t src,
                      int64_t dst, uint32_t length) {
  uint32_t rows, idx_region, idx_max;
  int64_t idx, src_stride, dst_stride;
  if (!reg0(c, CMD0_OPCODE_NPU_SET_DMA0_SIZE0, &rows) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_DMA0_IDX_REGION, &idx_region) ||
      !reg1(c, CMD1_OPCODE_NPU_SET_DMA0_IDX_MAX, &idx_max, NULL) ||
      !reg1(c, CMD1_OPCODE_NPU_SET_DMA0_IDX, NULL, &idx) ||
      !reg1(c, CMD1_OPCODE_NPU_SET_DMA0_SRC_STRIDE0, NULL, &src_stride) ||
      !reg1(c, CMD1_OPCODE_NPU_SET_DMA0_DST_STRIDE0, NULL, &dst_stride))
    return false;
  src_stride = s40(src_stride);
  dst_stride = s40(dst_stride);
  return access_region(c, (int)(idx_region & 0x7), idx, 4 * (int64_t)rows, "DMA index") &&
         access_region(c, (int)(src_region & 0x7), src,
                       (int64_t)(idx_max & 0x7FFFFFFF) * (src_stride > 0 ? src_stride : 0) + length,
                       "DMA source") &&
         access_region(c, (int)(dst_region & 0x7), dst,
                       ((int64_t)rows - 1) * (dst_stride > 0 ? dst_stride : 0) + length,
                       "DMA destination");
}
#endif

static bool op_dma(check_t* c) {
  uint32_t src_region, dst_region, length;
  int64_t src, dst;
  if (!reg0(c, CMD0_OPCODE_NPU_SET_DMA0_SRC_REGION, &src_region) ||
      !reg0(c, CMD0_OPCODE_NPU_SET_DMA0_DST_REGION, &dst_region) ||
      !reg1(c, CMD1_OPCODE_NPU_SET_DMA0_SRC, NULL, &src) ||
      !reg1(c, CMD1_OPCODE_NPU_SET_DMA0_DST, NULL, &dst) ||
      !reg1(c, CMD1_OPCODE_NPU_SET_DMA0_LEN, &length, NULL))
    return false;
#if defined(ETHOSU85)
  if ((src_region & 0x800) && !(dst_region & 0x800) && ((src_region >> 9) & 0x3) == 1 &&
      !((src_region | dst_region) & 0x100))
    return op_gather(c, src_region, dst_region, src, dst, length);
  if ((src_region | dst_region) & 0x800) return not_bounded(c, "an indexed DMA");
  if ((src_region | dst_region) & 0x100) return not_bounded(c, "a DMA in the NPU's memory");
#endif
  if ((src_region >> 9) & 0x3) return not_bounded(c, "a 2-D/3-D DMA");
  int src_at = src_region & 0x100 ? SHRAM_REGION : (int)(src_region & 0x7);
  int dst_at = dst_region & 0x100 ? SHRAM_REGION : (int)(dst_region & 0x7);
  return access_region(c, src_at, src, length, "DMA source") &&
         access_region(c, dst_at, dst, length, "DMA destination");
}

static bool check_commands(check_t* c, uint32_t start, uint32_t end) {
  uint32_t index = start, last = start;
  const char* last_name = NULL;
  bool stopped = false;
  for (size_t i = 0; i < sizeof(c->cmd0_set); i++) c->cmd0_set[i] = 0;
  for (size_t i = 0; i < sizeof(c->cmd1_set); i++) c->cmd1_set[i] = 0;
  while (index < end) {
    uint32_t word = c->words[index];
    uint32_t opcode = word & 0x3FF, control = word & 0xC000, param = word >> 16;
    last = index;
    if (control == 0 && !(word & 0x3C00) && opcode < CMD0_COUNT &&
        known(cmd0_opcode_str[opcode])) {
      const char* name = strip(cmd0_opcode_str[opcode], 12);
      last_name = name;
      stopped = opcode == CMD0_OPCODE_NPU_OP_STOP;
      c->op_name = name;
      c->op_code = opcode;
      c->op_offset = index;
      bool ok = true;
      switch (opcode) {
        case CMD0_OPCODE_NPU_OP_CONV:
        case CMD0_OPCODE_NPU_OP_DEPTHWISE: ok = op_conv(c, param); break;
        case CMD0_OPCODE_NPU_OP_POOL: ok = op_pool(c, param); break;
#if defined(ETHOSU85)
        case CMD0_OPCODE_NPU_OP_RESIZE: ok = op_resize(c); break;
#endif
        case CMD0_OPCODE_NPU_OP_ELEMENTWISE: ok = op_elementwise(c, param); break;
        case CMD0_OPCODE_NPU_OP_DMA_START: ok = op_dma(c); break;
        default:
          if (opcode >= 0x100) { /* a register */
            c->cmd0[opcode] = (uint16_t)param;
            c->cmd0_set[opcode / 8] |= 1u << (opcode % 8);
          }
      }
      if (!ok) return false;
      index += 1;
    } else if (control == 0x4000 && !(word & 0x3C00) && opcode < CMD1_COUNT &&
               known(cmd1_opcode_str[opcode]) && index + 1 < end) {
      last_name = strip(cmd1_opcode_str[opcode], 12);
      stopped = false;
#if defined(ETHOSU85)
      if (opcode == CMD1_OPCODE_NPU_OP_BRANCH) {
        c->op_name = last_name;
        c->op_code = opcode;
        c->op_offset = index;
        not_bounded(c, "NPU_OP_BRANCH");
      }
#endif
      c->cmd1_param[opcode] = (uint16_t)param;
      c->cmd1_payload[opcode] = c->words[index + 1];
      c->cmd1_set[opcode / 8] |= 1u << (opcode % 8);
      index += 2;
    } else {
      snprintf(c->message, sizeof(c->message), "command word %#010lx at word %lu is not a "
               "command of this NPU", (unsigned long)word, (unsigned long)index);
      return refuse(c, c->message);
    }
  }
  if (!stopped) {
    if (last_name == NULL)
      return refuse(c, "the command stream does not end with NPU_OP_STOP (it is empty)");
    snprintf(c->message, sizeof(c->message), "the command stream does not end with NPU_OP_STOP "
             "(its last command is %s at word %lu)", last_name, (unsigned long)last);
    return refuse(c, c->message);
  }
  return true;
}

static bool check_payload(const void* data, int bytes, const size_t* sizes, const bool* present,
                          int regions) {
  check_t* c = &check_state;
  c->words = (const uint32_t*)data;
  c->sizes = sizes;
  c->present = present;
  c->regions = regions;
  c->shram_bytes = 0;
  uint32_t count = (uint32_t)bytes / 4;
  if (bytes % 4 || count == 0 || c->words[0] != COP1_FOURCC)
    return refuse(c, "the custom operator payload does not start with the COP1 fourcc");
  uint32_t index = 1;
  while (index < count) {
    uint32_t word = c->words[index], action = word & 0xFF;
    if (action == ACTION_OPTIMIZER_CONFIG && index + 2 < count) {
      c->shram_bytes = (int64_t)((c->words[index + 1] >> 8) & 0xFF) * 1024; /* config_r */
      index += 3;
    } else if (action == ACTION_COMMAND_STREAM) {
      uint32_t length = (((word >> 8) & 0xFF) << 16) | (word >> 16);
      if (index + 1 + length > count) {
        snprintf(c->message, sizeof(c->message), "COMMAND_STREAM at word %lu claims %lu words but "
                 "the payload has %lu left", (unsigned long)index, (unsigned long)length,
                 (unsigned long)(count - index - 1));
        return refuse(c, c->message);
      }
      if (!check_commands(c, index + 1, index + 1 + length)) return false;
      index += 1 + length;
    } else if (action == ACTION_NOP) {
      index += 1;
    } else {
      snprintf(c->message, sizeof(c->message), "driver action %lu at word %lu is not one of "
               "OPTIMIZER_CONFIG, COMMAND_STREAM or NOP", (unsigned long)action,
               (unsigned long)index);
      return refuse(c, c->message);
    }
  }
  return true;
}

int __wrap_ethosu_invoke_v3(struct ethosu_driver* drv, const void* custom_data_ptr,
                            const int custom_data_size, uint64_t* const base_addr,
                            const size_t* base_addr_size, const int num_base_addr,
                            void* user_arg) {
  size_t sizes[8] = {0};
  bool present[8] = {false};
  int regions = num_base_addr < 8 ? num_base_addr : 8;
  for (int i = 0; i < regions; i++) {
    present[i] = base_addr[i] != 0; /* a region without a base address: no fast scratch */
    sizes[i] = base_addr_size[i];
  }
  if (!check_payload(custom_data_ptr, custom_data_size, sizes, present, regions)) return -1;
  return __real_ethosu_invoke_v3(drv, custom_data_ptr, custom_data_size, base_addr,
                                 base_addr_size, num_base_addr, user_arg);
}
