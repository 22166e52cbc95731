"""The Ethos-U85 model's resize and elementwise operations (NPU_OP_RESIZE, NPU_OP_ELEMENTWISE):
a part of `U85Machine` (npu_driver/ethos_u/u85_machine.py), kept in its own module so that each
reads in one sitting. The methods use the machine's register access, feature maps and output
stage; see u85_machine.py's docstring for what is modelled."""

from __future__ import annotations

import numpy as np

from npu_driver.ethos_u import arith
from npu_driver.ethos_u.errors import where
from npu_driver.ethos_u.stream import Command
from npu_driver.ethos_u.u85_commands import enum_names, fields, table

_ELEMENTWISE = enum_names("elementwise_mode")
_ROUND_OFM = enum_names("round_mode_ofm")
_ROUND_IFM = enum_names("round_mode_ifm")
_RESIZE = enum_names("resize_mode")
_UPSCALE = enum_names("ifm_upscale_mode")
_SCALAR = table()["enums"]["broadcast_mode"]["SCALAR"]
_COMPARE = {"CMP_EQ": np.equal, "CMP_NE": np.not_equal, "CMP_GE": np.greater_equal,
            "CMP_GT": np.greater}
_BITWISE = ("AND", "OR", "XOR", "AND_NOT", "NOT")


class ResizeAndElementwise:
    """NPU_OP_RESIZE and NPU_OP_ELEMENTWISE for `U85Machine` (a mixin: `self` is the machine)."""

    # -- resize ------------------------------------------------------------------------------

    def _resize_axis(self, axis: str, size: int, block: int, op: Command):
        """One axis of a resize, as regor's GenerateResizeOp writes it: the scale's numerator
        n (RESIZE_<axis>_SCALE_N_M1 + 1), its denominator d (one_step_int x n + one_step_mod:
        the input advance per output step) and the offset (12 bits, two's complement). Output
        position o samples input position o x d + offset in units of 1/n, TOSA RESIZE's
        `y = oy * scale_y_d + offset_y`. The block step must be the (block - 1) steps it
        stands for, where the model computes every position from the formula."""
        n = self.param(f"NPU_SET_RESIZE_{axis}_SCALE_N_M1", op) + 1
        steps = fields(self.reg(f"NPU_SET_RESIZE_{axis}", op))
        d = steps["one_step_int"] * n + steps["one_step_mod"]
        if steps["one_step_mod"] >= n or steps["blk_step_mod"] >= n or (
                steps["blk_step_int"] * n + steps["blk_step_mod"] != (block - 1) * d):
            raise self._refuse(op, f"RESIZE_{axis} steps {steps} that are not the scale "
                                   f"{n}/{d}'s over an OFM block of {block}")
        offset = self.param(f"NPU_SET_RESIZE_{axis}_OFFSET", op) & 0xFFF
        offset -= (offset & 0x800) << 1
        position = np.arange(size, dtype=np.int64) * d + offset
        return position // n, position % n, n

    def _op_resize(self, op: Command) -> None:
        """RESIZE (regor's native U85 resize): TOSA RESIZE's integer algorithm on the IFM,
        zero point removed, of KERNEL_HEIGHT x KERNEL_WIDTH elements at the OFM's depth:
        NEAREST takes input (iy, ix), + 1 where 2 x remainder >= n, clamped to the IFM;
        BILINEAR sums the four neighbours (clamped) weighted (n - r) and r per axis. The
        NPU's result carries 16 fraction bits: regor writes OFM_SCALE scale 1 with shift 16
        plus the shift of the RESCALE it fuses (the 1 / (n_y x n_x) of a bilinear resize),
        and 16 alone for NEAREST, so the output stage sees the TOSA value x 2**16."""
        mode = _RESIZE.get(fields(op)["resize_mode"], "reserved")
        if mode not in ("NEAREST", "BILINEAR"):
            raise self._refuse(op, f"resize mode {mode}")
        bits = self._accumulator(op)
        if not self._global_scale(op) or any(self._padding(op)):
            raise self._refuse(op, "a resize with per-channel scales or IFM padding")
        if _UPSCALE.get(self.field("NPU_SET_IFM_UPSCALE", "mode", op)) != "NONE":
            raise self._refuse(op, "a resize of an upscaled IFM")
        ofm = self._fm("OFM", op)
        oh, ow, oc = self._ofm_shape(op)
        ih = self.param("NPU_SET_KERNEL_HEIGHT_M1", op) + 1
        iw = self.param("NPU_SET_KERNEL_WIDTH_M1", op) + 1
        iy, ry, ny = self._resize_axis("Y", oh, self.param("NPU_SET_OFM_BLK_HEIGHT_M1", op) + 1,
                                       op)
        ix, rx, nx = self._resize_axis("X", ow, self.param("NPU_SET_OFM_BLK_WIDTH_M1", op) + 1,
                                       op)
        if iy.min() < -1 or ix.min() < -1 or iy.max() >= ih or ix.max() >= iw:
            raise self._refuse(op, f"a resize sampling outside its {ih}x{iw} IFM")
        ifm = self._fm("IFM", op)
        zp = self._zero_point("NPU_SET_IFM_ZERO_POINT", ifm, op)
        values = self._read(ifm, (ih, iw, oc), op) - zp
        iy0, iy1 = np.maximum(iy, 0), np.minimum(iy + 1, ih - 1)
        ix0, ix1 = np.maximum(ix, 0), np.minimum(ix + 1, iw - 1)
        if mode == "NEAREST":
            rows = np.where(2 * ry >= ny, iy1, iy0)
            cols = np.where(2 * rx >= nx, ix1, ix0)
            acc = values[rows][:, cols]
        else:
            wy, wx = ry[:, None, None], rx[None, :, None]
            acc = (values[iy0][:, ix0] * (ny - wy) * (nx - wx)
                   + values[iy0][:, ix1] * (ny - wy) * wx
                   + values[iy1][:, ix0] * wy * (nx - wx)
                   + values[iy1][:, ix1] * wy * wx)
        acc = np.asarray(acc, dtype=np.int64) << 16
        self._check_accumulator(acc, bits, op)
        scale, shift = self._scale_pair("NPU_SET_OFM_SCALE", op)
        if scale != 1 or shift < 16:
            raise self._refuse(op, f"a resize with OFM_SCALE {scale}, shift {shift} (regor "
                                   "writes scale 1, shift 16 and up)")
        if mode == "NEAREST" and shift == 16:
            out = acc >> 16  # exact: no rounding mode changes a whole value
        else:
            out = arith.scale_shift(acc, 1, shift,
                                    self._rounding("NPU_SET_OFM_SCALE", op, _ROUND_OFM, shift))
        self._write_ofm(ofm, self._output(out, ofm, op), op)
        self.counters.operations[f"resize.{mode.lower()}"] += 1

    # -- elementwise -------------------------------------------------------------------------

    def _operand(self, name: str, op: Command, shape) -> np.ndarray:
        """IFM or IFM2 as the OFM's shape, zero point removed: broadcast along the dimensions
        its BROADCAST register names, or the OP_SCALAR value (SCALAR)."""
        broadcast = self.field(f"NPU_SET_{name}_BROADCAST", "broadcast_mode", op)
        oh, ow, oc = shape
        if broadcast == _SCALAR:
            precision = fields(self.reg(f"NPU_SET_{name}_PRECISION", op))
            value = fields(self.reg("NPU_SET_OP_SCALAR", op))["scalar"]
            if precision["activation_type"] and value & 0x80000000:
                value -= 1 << 32
            zp_reg = self.reg(f"NPU_SET_{name}_ZERO_POINT", op)
            zp = zp_reg.signed_param if precision["activation_type"] else zp_reg.param
            return np.full(shape, value - zp, dtype=np.int64)
        if broadcast & ~0x7:
            raise self._refuse(op, f"{name}_BROADCAST {broadcast}")
        fm = self._fm(name, op)
        part = (1 if broadcast & 1 else oh, 1 if broadcast & 2 else ow, 1 if broadcast & 4 else oc)
        zp = self._zero_point(f"NPU_SET_{name}_ZERO_POINT", fm, op)
        return np.broadcast_to(self._read(fm, part, op) - zp, shape)

    def _op_elementwise(self, op: Command) -> None:
        mode = _ELEMENTWISE.get(fields(op)["elementwise_mode"], "reserved")
        if mode not in ("ADD", "SUB", "MUL", "MIN", "MAX", "ABS", "SHR", "SHL", "CLZ", *_COMPARE,
                        *_BITWISE):
            raise self._refuse(op, f"elementwise mode {mode}")
        bits = self._accumulator(op)
        ofm = self._fm("OFM", op)
        shape = self._ofm_shape(op)
        a = self._operand("IFM", op, shape)
        b = None if mode in ("ABS", "NOT", "CLZ") else self._operand("IFM2", op, shape)
        if mode in ("SHR", "SHL", "CLZ"):
            # the shifts and CLZ of Vela's TFLite softmax (regor compiler/softmax.cpp), as on
            # the Ethos-U55 (machine.Machine._bit_operation): no OFM scaling
            rounding = self._rounding("NPU_SET_OFM_SCALE", op, _ROUND_OFM, 1)
            result = arith.bit_operation(mode.lower(), a, b, self._operand_bytes("IFM", op),
                                   rounding, where(op.name, op.offset))
            self._write_ofm(ofm, self._output(result, ofm, op), op)
            self.counters.operations[f"elementwise.{mode.lower()}"] += 1
            return
        if mode in _BITWISE:
            result = self._bitwise(mode, a, b, op)
        elif mode in _COMPARE:
            # each operand scaled as ADD's are, then compared: true is all ones (-1), false 0,
            # regor's internal bool (ConvertBool8Tensors: "-1 (true) and 0 (false)"), the mask
            # its SELECT (AND / AND_NOT / OR of the two choices) takes
            a = self._operand_scale("NPU_SET_IFM_SCALE", a, op)
            b = self._operand_scale("NPU_SET_IFM2_SCALE", b, op)
            result = np.where(_COMPARE[mode](a, b), -1, 0)
            self._unit_output(mode, op)
        elif mode == "ABS":
            # |IFM - zero point|, then OFM_SCALE (regor's Abs: the rescale in OFM_SCALE, the
            # operand scale unit)
            if "NPU_SET_IFM_SCALE" in self.regs and self._scale_pair(
                    "NPU_SET_IFM_SCALE", op) != (1, 0):
                raise self._refuse(op, "elementwise ABS with an IFM_SCALE")
            result = np.abs(np.asarray(a, dtype=np.int64))
        elif mode in ("ADD", "SUB", "MIN", "MAX"):
            # each operand scaled by its IFM(2)_SCALE first (the TOSA RESCALEs to a common
            # scale that Vela fuses into the operation)
            a = self._operand_scale("NPU_SET_IFM_SCALE", a, op)
            b = self._operand_scale("NPU_SET_IFM2_SCALE", b, op)
            result = {"ADD": np.add, "SUB": np.subtract, "MIN": np.minimum,
                      "MAX": np.maximum}[mode](a, b)
            if not (self._operand_bytes("IFM", op) == 4 and ofm.element_size == 4):
                self._check_accumulator(result, bits, op)
            # else: 32-bit operands into a 32-bit OFM (Vela's TFLite softmax) saturate at the
            # output, as the Ethos-U55 model's do; its Newton-Raphson step reaches 2**31 and
            # TFLM's result is the saturated one
        else:
            # MUL: regor writes unit operand scales (it asserts so); another scale would have
            # to be applied somewhere the model does not know
            for name in ("NPU_SET_IFM_SCALE", "NPU_SET_IFM2_SCALE"):
                if name in self.regs and self._scale_pair(name, op) != (1, 0):
                    raise self._refuse(op, f"elementwise {mode} with {name} "
                                           f"{self._scale_pair(name, op)} (not a unit scale)")
            result = np.asarray(a, dtype=np.int64) * np.asarray(b, dtype=np.int64)
            if self._operand_bytes("IFM", op) == 4 and ofm.element_size == 4 and \
                    self._global_scale(op):
                # a 32-bit MUL (Vela's TFLite softmax: Q31 products): the 64-bit product takes
                # OFM_SCALE's shift alone, as on the Ethos-U55 (whose interface says the scale
                # is not applied for 32-bit operations); regor writes 2**30 with shift 31 for
                # round(a x b / 2**31), which TFLM's softmax computes
                shift = self._scale_pair("NPU_SET_OFM_SCALE", op)[1]
                rounding = self._rounding("NPU_SET_OFM_SCALE", op, _ROUND_OFM, shift)
                out = self._output(arith.scale_shift(result, 1, shift, rounding), ofm, op)
                self._write_ofm(ofm, out, op)
                self.counters.operations["elementwise.mul"] += 1
                return
            self._check_accumulator(result, bits, op)
        if not self._global_scale(op):
            raise self._refuse(op, f"elementwise {mode} with per-channel OFM scales")
        out = self._output(self._scale_output(np.asarray(result, dtype=np.int64), op,
                                              shape[2]), ofm, op)
        self._write_ofm(ofm, out, op)
        self.counters.operations[f"elementwise.{mode.lower()}"] += 1

    def _operand_bytes(self, name: str, op: Command) -> int:
        """The element size of IFM or IFM2 from its PRECISION register (also for an operand
        that is the OP_SCALAR, which has no feature map): 1, 2 or 4 bytes."""
        precision = fields(self.reg(f"NPU_SET_{name}_PRECISION", op))["activation_precision"]
        return {0: 1, 1: 2, 2: 4}.get(precision, 8)

    def _bitwise(self, mode: str, a, b, op: Command) -> np.ndarray:
        """AND, OR, XOR, AND_NOT (IFM & ~IFM2: regor's SELECT takes its false choice as IFM
        and the mask as IFM2), NOT (~IFM) on the operands' two's-complement bits. Vela writes
        them with zero points 0 and unit scales; another zero point or scale would have to be
        applied somewhere the model does not know, so it is refused."""
        for name in ("IFM",) if b is None else ("IFM", "IFM2"):
            if self.param(f"NPU_SET_{name}_ZERO_POINT", op):
                raise self._refuse(op, f"elementwise {mode} with a non-zero {name} zero point")
            scale = f"NPU_SET_{name}_SCALE"
            if scale in self.regs and self._scale_pair(scale, op) != (1, 0):
                raise self._refuse(op, f"elementwise {mode} with {scale} "
                                       f"{self._scale_pair(scale, op)}")
        self._unit_output(mode, op)
        a = np.asarray(a, dtype=np.int64)
        if mode == "NOT":
            return ~a
        b = np.asarray(b, dtype=np.int64)
        return {"AND": a & b, "OR": a | b, "XOR": a ^ b, "AND_NOT": a & ~b}[mode]

    def _unit_output(self, mode: str, op: Command) -> None:
        """A comparison's or bitwise operation's result goes out unscaled: Vela writes a unit
        OFM_SCALE and OFM zero point 0 for them."""
        if self._scale_pair("NPU_SET_OFM_SCALE", op) != (1, 0) or self.param(
                "NPU_SET_OFM_ZERO_POINT", op):
            raise self._refuse(op, f"elementwise {mode} with OFM_SCALE "
                                   f"{self._scale_pair('NPU_SET_OFM_SCALE', op)} or a non-zero "
                                   "OFM zero point")

    def _operand_scale(self, name: str, values: np.ndarray, op: Command) -> np.ndarray:
        """An ADD/SUB operand times its IFM(2)_SCALE scale / 2**shift, rounded as the
        register's round_mode says (regor fuses the TOSA RESCALE of each operand here)."""
        scale, shift = self._scale_pair(name, op)
        rounding = self._rounding(name, op, _ROUND_IFM, shift)
        return arith.scale_shift(values, scale, shift, rounding)
