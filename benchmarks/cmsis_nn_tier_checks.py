"""CMSIS-NN's argument checks that one ISA tier compiles and another does not: every integer
kernel source (and header) evaluated under the three tiers' defines (scalar: none; DSP:
ARM_MATH_DSP; MVE: ARM_MATH_DSP + ARM_MATH_MVEI), each `return ARM_CMSIS_NN_ARG_ERROR`,
`_FAILURE` or `_NO_IMPL_ERROR` listed with the tiers that compile it when that is not all three,
with the `if` that guards it. Then the CMSIS-NN entry points ExecuTorch's Cortex-M operators call.
This is the search docs/verify.md reports ("What the DSP path refuses that the C path accepts").

    python benchmarks/cmsis_nn_tier_checks.py [--third-party DIR]

Conditions on other macros (include guards, compiler versions) are taken as equal in every tier;
the ones naming a compiler are printed, since GCC, which builds every firmware, may not take them.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

TIERS = {"scalar": set(), "dsp": {"ARM_MATH_DSP"}, "mve": {"ARM_MATH_DSP", "ARM_MATH_MVEI"}}
TIER_MACROS = ("ARM_MATH_DSP", "ARM_MATH_MVEI")
RETURN = re.compile(r"return\s+(ARM_CMSIS_NN_ARG_ERROR|ARM_CMSIS_NN_FAILURE|ARM_CMSIS_NN_NO_IMPL_ERROR)")
DIRECTIVE = re.compile(r"#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)")


def _truth(condition: str, defined: set[str], others: set[str]) -> bool:
    if not any(macro in condition for macro in TIER_MACROS):
        return True
    def substitute(match):
        if match[1] in TIER_MACROS:
            return str(match[1] in defined)
        others.add(condition.strip())
        return "True"
    expression = re.sub(r"defined\s*\(?\s*(\w+)\s*\)?", substitute, condition)
    expression = expression.replace("&&", " and ").replace("||", " or ").replace("!", " not ")
    try:
        return bool(eval(expression, {"__builtins__": {}}, {}))  # noqa: S307 - True/False/and/or/not only
    except Exception:  # noqa: BLE001 - another macro's arithmetic: the same in every tier
        others.add(condition.strip())
        return True


def _live_lines(text: str, defined: set[str], others: set[str]) -> set[int]:
    stack, active, live = [], True, set()
    for number, line in enumerate(text.splitlines(), 1):
        match = DIRECTIVE.match(line.strip())
        if not match:
            if active:
                live.add(number)
            continue
        kind, rest = match[1], match[2].split("//")[0].split("/*")[0].strip()
        if kind in ("if", "ifdef", "ifndef"):
            condition = {"if": rest, "ifdef": f"defined({rest})", "ifndef": f"!defined({rest})"}[kind]
            value = _truth(condition, defined, others)
            stack.append([value, active])
            active = active and value
        elif kind == "elif":
            value = not stack[-1][0] and _truth(rest, defined, others)
            stack[-1][0] = stack[-1][0] or value
            active = stack[-1][1] and value
        elif kind == "else":
            value = not stack[-1][0]
            stack[-1][0] = True
            active = stack[-1][1] and value
        else:
            active = stack.pop()[1]
    return live


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--third-party", default=None)
    args = parser.parse_args()
    from kernels.native.sources import find_third_party

    sources = find_third_party(args.third_party)
    cmsis = sources.cmsis_nn
    others: set[str] = set()
    for path in sorted([*cmsis.glob("Source/**/*.c"), *cmsis.glob("Include/**/*.h")]):
        if re.search(r"_f(16|32)(_common)?\.[ch]$", path.name):
            continue  # float kernels: not built (ARM_NN_ENABLE_F32=0, ARM_NN_ENABLE_F16=0)
        text = path.read_text(errors="replace")
        lines = text.splitlines()
        returns = [n for n, line in enumerate(lines, 1) if RETURN.search(line)]
        if not returns:
            continue
        live = {tier: _live_lines(text, defined, others) for tier, defined in TIERS.items()}
        for number in returns:
            tiers = [tier for tier in TIERS if number in live[tier]]
            if len(tiers) == len(TIERS):
                continue
            guard = next((lines[n - 1].strip() for n in range(number - 1, 0, -1)
                          if re.search(r"\bif\s*\(", lines[n - 1])), "")
            print(f"{path.relative_to(cmsis)}:{number}: {'+'.join(tiers) or 'none'}: "
                  f"{guard[:100]} -> {lines[number - 1].strip()}")
    print("\nconditions on other macros, taken as equal in every tier:")
    for condition in sorted(others):
        print(f"  {condition}")
    ops = sources.executorch / "backends/cortex_m/ops"
    called = sorted({m for p in ops.glob("*.cpp") for m in re.findall(r"\b(arm_\w+)\(", p.read_text())})
    print(f"\nCMSIS-NN entry points ExecuTorch's Cortex-M operators call ({len(called)}):")
    print("  " + ", ".join(called))


if __name__ == "__main__":
    main()
