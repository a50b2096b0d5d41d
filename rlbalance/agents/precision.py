"""The torso's precision per machine (learner.torso_precision=auto): bfloat16 autocast where the device computes
bfloat16 natively, float32 where bfloat16 would be emulated; images always channels-last.

The rule, per device type:

- CPU: bfloat16 where the CPU's flags have ``avx512_bf16`` or ``amx_bf16`` (oneDNN's bfloat16 convolutions and
  GEMMs run natively there; elsewhere they are emulated in float32 and run slower than float32 itself);
- CUDA: bfloat16 where ``torch.cuda.is_bf16_supported()`` (Ampere and later);
- anything else: float32.

'auto' turns bfloat16 on for image torsos (the Nature CNN) only: an MLP's few small matrix products gain nothing
and pay the casts. Measured on a Nature CNN learner step, bench/results/precision/.
"""

from __future__ import annotations

import functools

import torch

from rlbalance.core.cpuinfo import cpu_flags

NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
IMAGE_LAYOUT = "channels_last"  # rlbalance.agents.nets.scaled_input: faster for oneDNN and cuDNN convolutions alike


@functools.lru_cache(maxsize=8)
def native_bf16(device_type: str) -> tuple[bool, str]:
    """(whether ``device_type`` computes bfloat16 natively, why)."""
    if device_type == "cpu":
        have = [f for f in NATIVE_BF16_CPU_FLAGS if f in cpu_flags()]
        if have:
            return True, f"the CPU has {' and '.join(have)} (native bfloat16)"
        return False, f"the CPU has neither {' nor '.join(NATIVE_BF16_CPU_FLAGS)}: bfloat16 would be emulated"
    if device_type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
        return ok, f"{name} {'supports' if ok else 'does not support'} bfloat16"
    return False, f"no bfloat16 rule for device type {device_type!r}"


def resolve(precision: str, device_type: str, image: bool) -> str:
    """The precision a torso runs at: 'fp32' or 'bf16' (``precision`` 'auto' decided by the rule above)."""
    if precision != "auto":
        return precision
    return "bf16" if image and native_bf16(device_type)[0] else "fp32"


def choice(precision: str, device: torch.device | str, image: bool) -> dict:
    """What a run records of the choice (config.json's "resolved", the report): asked, used, layout and why."""
    dtype = torch.device(device).type
    used = resolve(precision, dtype, image)
    if precision != "auto":
        why = f"learner.torso_precision={precision} was set"
    elif not image:
        why = "auto: float32 for a vector-observation torso (bfloat16 only pays for convolutions)"
    else:
        why = f"auto on {dtype}: {native_bf16(dtype)[1]}"
    return {"torso_precision": used, "asked": precision, "device": dtype,
            "image_layout": IMAGE_LAYOUT if image else "n/a", "why": why}
