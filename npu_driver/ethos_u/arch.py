"""Per-configuration facts of the Ethos-U55/U65 that change what the command stream means.

Only what the functional model needs: the MAC count (to check the stream's optimizer config),
the micro-block depths that fix the order in which the weight decoder hands weights to the MAC
array, and the shared buffer (SHRAM) geometry that fixes where activation lookup tables live.
Values from Vela's `architecture_features.py::ArchitectureFeatures.accelerator_configs`
(ArchitectureConfig(macs, cores, ofm_ublock, ifm_ublock, shram_banks, ...)) and
`ArchitectureFeatures.__init__` (1 KiB banks, 256-byte LUT slots, a 2 KiB LUT at the end of SHRAM).
"""

from __future__ import annotations

from dataclasses import dataclass

# config_r (ethos_u55_regs.py::config_r, ethosu55_interface.h CONFIG): product field.
PRODUCT_U55 = 0
PRODUCT_U65 = 1
SHRAM_BANK_BYTES = 1024
LUT_SLOT_BYTES = 256
LUT_BYTES = 2048


@dataclass(frozen=True)
class Accelerator:
    name: str
    product: int  # CONFIG.product the driver compares (ethosu_dev_verify_optimizer_config)
    macs: int
    cores: int
    ofm_ublock_depth: int
    ifm_ublock_depth: int
    shram_banks: int

    @property
    def log2_macs(self) -> int:
        return self.macs.bit_length() - 1

    @property
    def shram_bytes(self) -> int:
        return self.shram_banks * SHRAM_BANK_BYTES

    @property
    def lut_address(self) -> int:
        """SHRAM byte address of LUT slot 0: the last two banks (Vela's `shram_lut_address`:
        bank size x available_shram_banks(uses_lut=True), which is banks - 2 in every config)."""
        return self.shram_bytes - LUT_BYTES

    @property
    def lut_banks_reserved(self) -> bool:
        """True when the LUT banks are reserved; with 16 banks or fewer (U55-32/64) the
        accumulators overwrite them (Vela `shram_reserved_unused_banks`, regor `reservedEndBanks`)."""
        return self.shram_banks > 16


ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (
    Accelerator("ethos-u55-32", PRODUCT_U55, 32, 1, 4, 8, 16),
    Accelerator("ethos-u55-64", PRODUCT_U55, 64, 1, 8, 8, 16),
    Accelerator("ethos-u55-128", PRODUCT_U55, 128, 1, 8, 8, 24),
    Accelerator("ethos-u55-256", PRODUCT_U55, 256, 1, 8, 8, 48),
    Accelerator("ethos-u65-256", PRODUCT_U65, 256, 1, 8, 8, 48),
    Accelerator("ethos-u65-512", PRODUCT_U65, 512, 2, 8, 8, 48),
)}


def accelerator_for(product: int, log2_macs: int) -> Accelerator:
    for accel in ACCELERATORS.values():
        if accel.product == product and accel.log2_macs == log2_macs:
            return accel
    raise KeyError(f"no Ethos-U55/U65 configuration with product {product} and "
                   f"{1 << log2_macs} MACs")
