"""The user's modules in the form the device kernels take, rewritten before capture.

Each rewrite keeps the module's meaning, leaves the user's module untouched (it works on a
copy) and is reported in the plan as a `Workaround`:

- `CortexMQuantizer` (ExecuTorch 1.5.1) annotates `conv2d` but not `conv1d`, so on a CPU-only
  target every 1-D convolution stays a float portable convolution (seconds per inference where
  CMSIS-NN's int8 kernel takes milliseconds). Before capture, each `nn.Conv1d` becomes the same
  convolution as a 1xK `nn.Conv2d` over an unsqueezed input (`conv1d_as_conv2d`), which the
  quantizer annotates and the Cortex-M passes route to CMSIS-NN; stride, padding, dilation and
  groups carry over, so depthwise, dilated and strided 1-D convolutions keep their meaning.
- The Arm backend's Ethos-U55 check refuses an average pool whose windows leave the last
  rows or columns unread (it counts the negative TOSA padding as padding); cut to its one
  window (`avg_pools_over_their_window`, `AvgPool2dWindow`), the same pool passes. Applied only
  when a policy asks for it (cost placement tries it and keeps it when Vela's estimate wins).

The rewrites of the exported program (what the portable kernels cannot run as built) are
partitioners/legalize.py.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Iterator

import torch

from kernels.catalogue import mve_conv_1xn_refusal
from partitioners.records import Workaround


def _conv2d_of(conv: torch.nn.Conv1d) -> torch.nn.Conv2d:
    padding = conv.padding if isinstance(conv.padding, str) else (0, conv.padding[0])
    conv2d = torch.nn.Conv2d(conv.in_channels, conv.out_channels, (1, conv.kernel_size[0]),
                             (1, conv.stride[0]), padding, (1, conv.dilation[0]), conv.groups,
                             conv.bias is not None, conv.padding_mode)
    with torch.no_grad():
        conv2d.weight.copy_(conv.weight.unsqueeze(2))
        if conv.bias is not None:
            conv2d.bias.copy_(conv.bias)
    return conv2d


def _batchnorm2d_of(bn: torch.nn.BatchNorm1d) -> torch.nn.BatchNorm2d:
    bn2d = torch.nn.BatchNorm2d(bn.num_features, bn.eps, bn.momentum, bn.affine,
                                bn.track_running_stats)
    bn2d.load_state_dict(bn.state_dict())
    return bn2d


def _pool2d_of(pool: torch.nn.Module) -> torch.nn.Module:
    if isinstance(pool, torch.nn.AdaptiveAvgPool1d):
        size = pool.output_size if isinstance(pool.output_size, int) else pool.output_size[0]
        return torch.nn.AdaptiveAvgPool2d((1, size))
    kernel, stride, padding = (pool.kernel_size[0] if isinstance(pool.kernel_size, tuple)
                               else pool.kernel_size,
                               pool.stride[0] if isinstance(pool.stride, tuple) else pool.stride,
                               pool.padding[0] if isinstance(pool.padding, tuple)
                               else pool.padding)
    if isinstance(pool, torch.nn.AvgPool1d):
        return torch.nn.AvgPool2d((1, kernel), (1, stride), (0, padding), pool.ceil_mode,
                                  pool.count_include_pad)
    return torch.nn.MaxPool2d((1, kernel), (1, stride), (0, padding), (1, pool.dilation),
                              ceil_mode=pool.ceil_mode)


_POOLS_1D = (torch.nn.AvgPool1d, torch.nn.MaxPool1d, torch.nn.AdaptiveAvgPool1d)
_ACTIVATIONS = (torch.nn.ReLU, torch.nn.ReLU6, torch.nn.Hardtanh)


class _As2d(torch.nn.Module):
    """1-D layers computed as their 2-D forms over an unsqueezed [N, C, 1, L] input (see the
    module docstring): a Conv1d with the BatchNorm1d and activation that follow it in the same
    Sequential (kept together, so the quantizer folds the norm and fuses the activation into
    the CMSIS-NN convolution), or a 1-D pool."""

    def __init__(self, layers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x.unsqueeze(-2)).squeeze(-2)


def _describe(layer: torch.nn.Module) -> str:
    if isinstance(layer, torch.nn.Conv1d):
        return (f"Conv1d({layer.in_channels}, {layer.out_channels}, kernel "
                f"{layer.kernel_size[0]}, stride {layer.stride[0]}, dilation "
                f"{layer.dilation[0]}, groups {layer.groups})")
    return type(layer).__name__


def _previous_as2d(parent: torch.nn.Module, names: list[str], folded: set[str]):
    """The converted group the layer after `names` continues: the last of `names` that is not
    a layer folded into a group, when it is one (only inside a Sequential, which runs its
    layers one into the next)."""
    if not isinstance(parent, torch.nn.Sequential):
        return None
    for name in reversed(names):
        if name in folded:
            continue
        layer = parent._modules[name]
        return layer if isinstance(layer, _As2d) else None
    return None


def conv1d_as_conv2d(module: torch.nn.Module, pools_only: bool = False
                     ) -> tuple[torch.nn.Module, list[Workaround]]:
    """A copy of `module` with every `nn.Conv1d` (with the BatchNorm1d and ReLU that follow it
    in a Sequential) and every 1-D pool as its 2-D form, and one Workaround per group;
    `module` itself is untouched. `pools_only` (an NPU target, whose quantizer takes Conv1d but
    not the 1-D pools: an AdaptiveAvgPool1d stayed a float portable op between two NPU
    partitions): the pools only."""
    converted = (lambda m: type(m) in _POOLS_1D) if pools_only else \
        (lambda m: type(m) is torch.nn.Conv1d or type(m) in _POOLS_1D)
    if not any(converted(m) for m in module.modules()):
        return module, []
    legal = copy.deepcopy(module)
    fixes = []
    for parent_path, parent in list(legal.named_modules()):
        names = list(parent._modules)
        skip = set()
        for position, name in enumerate(names):
            child = parent._modules[name]
            if name in skip or not converted(child):
                continue
            group = [child]
            if type(child) is torch.nn.Conv1d and isinstance(parent, torch.nn.Sequential):
                following = names[position + 1:position + 3]
                for other in following:
                    layer = parent._modules[other]
                    if len(group) == 1 and type(layer) is torch.nn.BatchNorm1d:
                        group.append(layer)
                    elif type(layer) in _ACTIVATIONS:
                        group.append(layer)
                        break
                    else:
                        break
            layers = [(_conv2d_of(m) if type(m) is torch.nn.Conv1d else
                       _batchnorm2d_of(m) if type(m) is torch.nn.BatchNorm1d else
                       _pool2d_of(m) if type(m) in _POOLS_1D else copy.deepcopy(m))
                      for m in group]
            before = _previous_as2d(parent, names[:position], skip)
            if before is not None:
                # Right after another converted group in the same Sequential: one unsqueeze for
                # both, so the 4-D channels-last tensor between them is not squeezed to 3-D
                # and back (a portable layout copy on each side of the pair).
                before.layers.extend(layers)
                before.train(child.training)  # the new layers' mode (a BatchNorm's statistics)
                parent._modules[name] = torch.nn.Identity()
                skip.add(name)
            else:
                replacement = _As2d(layers)
                replacement.train(child.training)
                parent._modules[name] = replacement
            for folded_name in names[position + 1:position + len(group)]:
                parent._modules[folded_name] = torch.nn.Identity()
                skip.add(folded_name)
            path = f"{parent_path}.{name}" if parent_path else name
            what = " + ".join(_describe(m) for m in group)
            fixes.append(Workaround(
                path, "ExecuTorch 1.5.1 EthosUQuantizer (annotates 2-D pools, not 1-D ones)"
                if pools_only else "ExecuTorch 1.5.1 CortexMQuantizer (annotates 2-D "
                "convolutions and pools, not 1-D ones)",
                f"{what} compiled as the same 1xK 2-D layer(s) over an unsqueezed input, so it "
                "is quantized and runs " + ("on the NPU" if pools_only else "on CMSIS-NN")
                + " (upstream leaves it a float portable op)"))
    return legal, fixes


class AvgPool2dWindow(torch.nn.Module):
    """An average pool whose one window leaves the input's last rows or columns unread,
    computed over that window only: the input cut to the window's rows and columns, then the
    same pool at stride 1. There is one window either way, so the values are the same."""

    def __init__(self, pool: torch.nn.AvgPool2d, rows: int, columns: int) -> None:
        super().__init__()
        self.rows, self.columns = rows, columns
        self.pool = torch.nn.AvgPool2d(pool.kernel_size, stride=1, padding=0, ceil_mode=False,
                                       count_include_pad=pool.count_include_pad,
                                       divisor_override=pool.divisor_override)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x[:, :, :self.rows, :self.columns])


def _pair(value) -> tuple[int, int]:
    return (int(value), int(value)) if isinstance(value, int) else tuple(int(v) for v in value)


def avg_pools_over_their_window(module: torch.nn.Module, example_inputs
                                ) -> tuple[torch.nn.Module, list[Workaround]]:
    """A copy of `module` with every `nn.AvgPool2d` that computes one window leaving the input's
    last rows or columns unread (no padding, floor mode) as `AvgPool2dWindow`, and one Workaround
    each; `module` itself is untouched.

    The Arm backend lowers such a pool with a negative TOSA padding (the rows no window reads),
    and its Ethos-U55 check counts that as padding: "Avgpool2d with padding needs kernel dims <
    8" refuses DS-CNN's (24, 5) pool over 25x5, and a stride above 3 is refused too. Cut to its
    window and at stride 1, the same pool passes the check. Whether the NPU runs it faster is
    cost placement's decision (Vela's estimate against the CPU's), so this rewrite is applied
    only when a policy asks for it (Policy.pool_windows)."""
    pools = [m for m in module.modules() if type(m) is torch.nn.AvgPool2d]
    if not pools:
        return module, []
    seen = _recorded_inputs(module, pools, example_inputs)
    windows = {}
    for pool in pools:
        shapes = seen.get(id(pool), set())
        shape = next(iter(shapes)) if len(shapes) == 1 else None  # one input size only
        kernel, stride = _pair(pool.kernel_size), _pair(pool.stride or pool.kernel_size)
        if shape is None or len(shape) != 4 or any(_pair(pool.padding)) or pool.ceil_mode:
            continue
        sizes = shape[2:]
        one_window = all(0 <= n - k < s for n, k, s in zip(sizes, kernel, stride))
        if one_window and any(n > k for n, k in zip(sizes, kernel)):
            windows[id(pool)] = (kernel, sizes)
    def windowed(child, found, path):
        (rows, columns), sizes = found
        return AvgPool2dWindow(child, rows, columns), Workaround(
            path, "ExecuTorch 1.5.1 Arm backend (lowers the rows no window reads as a "
            "negative padding, which its Ethos-U55 check refuses as padding)",
            f"AvgPool2d({rows}x{columns}) over {sizes[0]}x{sizes[1]} computed over its one "
            f"window: the input cut to {rows}x{columns}, then the same pool at stride 1 (the "
            "same values), so the NPU can run it")

    return _replaced(module, windows, windowed)


def _replaced(module: torch.nn.Module, found: dict, replace) -> tuple[torch.nn.Module,
                                                                      list[Workaround]]:
    """A copy of `module` (`module` itself untouched when nothing is found) with each layer
    whose original's id is a key of `found` replaced by `replace(layer, found[id], path)`'s
    module, and the Workarounds it returns."""
    if not found:
        return module, []
    legal = copy.deepcopy(module)
    originals = dict(zip((id(m) for m in legal.modules()), module.modules()))
    fixes = []
    for parent_path, parent in list(legal.named_modules()):
        for name, child in list(parent._modules.items()):
            entry = found.get(id(originals.get(id(child))))
            if entry is None:
                continue
            path = f"{parent_path}.{name}" if parent_path else name
            parent._modules[name], fix = replace(child, entry, path)
            fixes.append(fix)
    return legal, fixes


class WidthPaddedConv2d(torch.nn.Module):
    """A convolution whose width padding is an explicit pad of its input (`left` columns of
    zeros before, `right` after, or the input's last `-right` columns dropped, which no window
    reads), then the same convolution without width padding: the same windows over the same
    values, so the same result."""

    def __init__(self, conv: torch.nn.Conv2d, left: int, right: int) -> None:
        super().__init__()
        self.left, self.right = left, right
        self.conv = copy.deepcopy(conv)
        self.conv.padding = (conv.padding[0], 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.pad(x, (self.left, max(self.right, 0)))
        if self.right < 0:
            x = x[:, :, :, :x.shape[3] + self.right]
        return self.conv(x)


@contextlib.contextmanager
def buffers_kept(module: torch.nn.Module) -> Iterator[None]:
    """Meanwhile `module` may run; afterwards every buffer holds what it held before, in place.
    A streaming model updates its state buffers on every forward
    (orchestrator/compilation/program_state.py): a trial run must not leave its frame in the
    state the program starts from."""
    before = [(buffer, buffer.detach().clone()) for buffer in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in before:
                buffer.copy_(value)


def _run_recording(module: torch.nn.Module, layers: list, example_inputs, record) -> None:
    """`module` run on `example_inputs` (no grad, its buffers kept) with `record(layer, args,
    output)` called after each of `layers` runs; the hooks are removed afterwards."""
    hooks = [layer.register_forward_hook(record) for layer in layers]
    try:
        with torch.no_grad(), buffers_kept(module):
            module(*example_inputs)
    finally:
        for hook in hooks:
            hook.remove()


def _recorded_inputs(module: torch.nn.Module, layers: list, example_inputs) -> dict:
    """id(layer) -> the input shapes each of `layers` saw when `module` ran `example_inputs`."""
    seen: dict[int, set[tuple[int, ...]]] = {}
    _run_recording(module, layers, example_inputs, lambda m, args, _out: seen.setdefault(
        id(m), set()).add(tuple(args[0].shape)))
    return seen


def mve_1xn_padding_explicit(module: torch.nn.Module, example_inputs
                             ) -> tuple[torch.nn.Module, list[Workaround]]:
    """A copy of `module` with every `nn.Conv2d` that CMSIS-NN's MVE 1xN kernel refuses
    (kernels.catalogue.mve_conv_1xn_refusal: a width padding whose last columns the stride never
    reaches) as `WidthPaddedConv2d`, and one Workaround each; `module` itself is untouched.

    arm_convolve_1_x_n_s8 requires on the MVE core that the padding it is given is the padding
    its windows read (`pad_w * 2 + total_pad % 2 == total_pad`): a stride-2 Conv1d of kernel 3
    and padding 1 over an even length gives `status -3` on the Cortex-M55 while the C path runs
    it. With the padding explicit and the convolution unpadded, the total padding is 0 and the
    same CMSIS-NN kernel runs it on the MVE core."""
    convs = [m for m in module.modules() if type(m) is torch.nn.Conv2d
             and not isinstance(m.padding, str) and m.padding_mode == "zeros"]
    if not convs:
        return module, []
    seen = _recorded_inputs(module, convs, example_inputs)
    found = {}
    for conv in convs:
        shapes = seen.get(id(conv), set())
        if len(shapes) != 1:
            continue
        (shape,) = shapes
        if len(shape) != 4:
            continue
        out_w = ((shape[3] + 2 * conv.padding[1] - conv.dilation[1] * (conv.kernel_size[1] - 1)
                  - 1) // conv.stride[1]) + 1
        out_h = ((shape[2] + 2 * conv.padding[0] - conv.dilation[0] * (conv.kernel_size[0] - 1)
                  - 1) // conv.stride[0]) + 1
        weight = (conv.out_channels, *conv.kernel_size, conv.in_channels // conv.groups)
        refusal = mve_conv_1xn_refusal(shape, weight, (shape[0], conv.out_channels, out_h, out_w),
                                       conv.stride, conv.padding, conv.dilation)
        if refusal is None or conv.padding[1] == 0:
            continue
        # Columns the last window reads past the input, beyond the left padding (negative:
        # trailing input columns no window reads, dropped).
        right = refusal["total"] - conv.padding[1]
        found[id(conv)] = (conv.padding[1], right, shape, refusal)
    def padded(child, entry, path):
        left, right, shape, refusal = entry
        edge = (f"{right} column(s) of zeros after" if right > 0 else
                f"its last {-right} column(s), which no window reads, dropped" if right < 0
                else "none after")
        return WidthPaddedConv2d(child, left, right), Workaround(
            path, "CMSIS-NN arm_convolve_1_x_n_s8, MVE path (refuses a padding its windows "
            f"do not read: padding {refusal['padding']}, total {refusal['total']}; "
            "status -3 on the Cortex-M55)",
            f"Conv2d over {shape[2]}x{shape[3]} computed with its width padding explicit "
            f"({left} column(s) of zeros before, {edge}) and no padding in the "
            "convolution: the same windows, which the MVE kernel accepts")

    return _replaced(module, found, padded)


def _channels_last_input(_conv: torch.nn.Module, args: tuple) -> tuple:
    """A forward pre-hook: the convolution's input in channels-last memory (a copy where its
    strides are not: with one channel `.contiguous()` keeps NCHW strides, both counting as
    contiguous, and the convolution would compute NCHW). The same values, so the same result;
    the module keeps its name (the plan's rows, `--precision` module names)."""
    x = args[0]
    if isinstance(x, torch.Tensor) and x.dim() == 4 and x.stride(1) != 1:
        return (x.clone(memory_format=torch.channels_last), *args[1:])
    return None


def _is_channels_last(value) -> bool:
    """Upstream's rule (executorch.backends.cortex_m.passes.passes_utils.is_channels_last)."""
    if not isinstance(value, torch.Tensor) or value.dim() != 4:
        return True
    if value.shape[1] == 1 or value.shape[2] == value.shape[3] == 1:
        return True
    return list(value.dim_order())[0:2] == [0, 2]


def _nchw_convs(module: torch.nn.Module, example_inputs) -> set[int]:
    """id() of each `nn.Conv2d` whose output is not channels-last when `module` runs as the
    capture runs it (its 4-D inputs and parameters channels-last); eager PyTorch picks the
    output's memory format as torch.export's fake tensors do."""
    trial = copy.deepcopy(module)
    originals = dict(zip((id(m) for m in trial.modules()), module.modules()))
    for parameter in trial.parameters():
        if parameter.dim() == 4:
            parameter.data = parameter.data.contiguous(memory_format=torch.channels_last)
    found: set[int] = set()
    inputs = tuple(x.contiguous(memory_format=torch.channels_last)
                   if isinstance(x, torch.Tensor) and x.dim() == 4 else x for x in example_inputs)
    _run_recording(trial, [layer for layer in trial.modules() if type(layer) is torch.nn.Conv2d],
                   inputs, lambda m, _args, out: None if _is_channels_last(out) else found.add(
                       id(originals[id(m)])))
    return found


def conv_inputs_channels_last(module: torch.nn.Module, example_inputs, skip: tuple[str, ...] = ()
                              ) -> tuple[torch.nn.Module, list[Workaround]]:
    """A copy of `module` in which each `nn.Conv2d` whose output would be NCHW is given its input
    channels-last (`_channels_last_input`), and one Workaround each; `module` itself is
    untouched.

    ExecuTorch 1.5.1's CortexMQuantizer annotates a convolution only when its output is
    channels-last (CortexMConv2DCheck); a convolution after a reshape or a channel chunk
    computes NCHW and stays float, on the portable kernel (ShuffleNetV2's branches: 71% of
    its MACs; a `.onnx`'s first convolution after its Reshape). `skip`: modules given int16
    activations (--precision a16w8), whose convolutions run on our own s16 kernel."""
    found = _nchw_convs(module, example_inputs)
    if not found:
        return module, []
    legal = copy.deepcopy(module)
    originals = dict(zip((id(m) for m in legal.modules()), module.modules()))
    fixes: list[Workaround] = []
    for path, layer in legal.named_modules():
        if id(originals.get(id(layer))) in found and not any(
                path == name or path.startswith(name + ".") for name in skip):
            layer.register_forward_pre_hook(_channels_last_input)
            fixes.append(Workaround(
                path, "ExecuTorch 1.5.1 CortexMQuantizer (CortexMConv2DCheck: a convolution "
                "whose output is not channels-last stays float, on the portable kernel)",
                "Conv2d given its input channels-last (a copy of it where it was not), so its "
                "output is channels-last and CMSIS-NN computes it in int8"))
    return (legal, fixes) if fixes else (module, [])
