"""Element-wise activations (notebook 07): ReLU, sigmoid and swish in one fused pass, and what fusion saves.

``activation_kernel`` computes the activation chosen at compile time in one read and one write;
:func:`activation_eager` writes the same function from elementary PyTorch ops (one kernel each),
:func:`activation_torch_op` is PyTorch's own single kernel, :func:`activation_reference` the float64 truth,
and :func:`activation_byte_model` predicts kernels, bytes and peak memory of each.
"""

from __future__ import annotations

import pandas as pd
import torch
import triton
import triton.language as tl

from .checks import check_power_of_two, check_vector_pair

__all__ = ["ACTIVATIONS", "activation_kernel", "activation_code", "launch_activation", "activation",
           "activation_eager", "activation_torch_op", "activation_reference", "activation_byte_model"]

ACTIVATIONS = {"relu": 0, "sigmoid": 1, "swish": 2}


@triton.jit
def activation_kernel(x_ptr, out_ptr, n_elements, ACTIVATION: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """out = f(x) in one pass: f is ReLU (0), sigmoid (1) or swish x*sigmoid(x) (2), chosen at compile time."""
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # compute in fp32 whatever the storage type
    if ACTIVATION == 0:  # a constexpr test: the compiler keeps only the chosen branch
        y = tl.maximum(x, 0.0)
    elif ACTIVATION == 1:
        y = 1.0 / (1.0 + tl.exp(-x))
    else:
        y = x / (1.0 + tl.exp(-x))  # x * sigmoid(x) without a second temporary
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


def activation_code(name: str) -> int:
    """The ``ACTIVATION`` constexpr of ``name`` (relu 0, sigmoid 1, swish 2); ValueError for another name."""
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def launch_activation(x, out, name: str, block_size: int, num_warps: int):
    """Launch :func:`activation_kernel` for activation ``name``; returns what the launch returns."""
    n = x.numel()
    return activation_kernel[(triton.cdiv(n, block_size),)](
        x, out, n, ACTIVATION=activation_code(name), BLOCK_SIZE=block_size, num_warps=num_warps
    )


def activation(x: torch.Tensor, name: str, *, out: torch.Tensor | None = None, block_size: int = 1024,
               num_warps: int = 4) -> torch.Tensor:
    """Fused Triton activation ``name`` (relu | sigmoid | swish) of a contiguous tensor."""
    activation_code(name)
    check_vector_pair(x, x, out)
    check_power_of_two("block_size", block_size, 16, 65536)
    check_power_of_two("num_warps", num_warps, 1, 32)
    out = torch.empty_like(x) if out is None else out
    if x.numel():
        launch_activation(x, out, name, block_size, num_warps)
    return out


def activation_eager(x: torch.Tensor, name: str) -> torch.Tensor:
    """The activation as written from its formula with elementary PyTorch ops (one kernel per op).

    relu = clamp_min(x, 0) (already one op); sigmoid = reciprocal(exp(-x) + 1) (neg, exp, add,
    reciprocal: 4 kernels); swish = x * sigmoid(x) (2 kernels).
    """
    code = activation_code(name)
    if code == 0:
        return torch.clamp_min(x, 0.0)
    if code == 1:
        return torch.reciprocal(torch.add(torch.exp(torch.neg(x)), 1.0))
    return torch.mul(x, torch.sigmoid(x))


def activation_torch_op(x: torch.Tensor, name: str) -> torch.Tensor:
    """PyTorch's own single-kernel op: torch.relu, torch.sigmoid, torch.nn.functional.silu."""
    code = activation_code(name)
    if code == 0:
        return torch.relu(x)
    if code == 1:
        return torch.sigmoid(x)
    return torch.nn.functional.silu(x)


def activation_reference(x: torch.Tensor, name: str) -> torch.Tensor:
    """The activation in float64 (the ground truth of the checks)."""
    code = activation_code(name)
    x64 = x.detach().to(torch.float64)
    if code == 0:
        return torch.clamp_min(x64, 0.0)
    sigmoid = 1.0 / (1.0 + torch.exp(-x64))
    return sigmoid if code == 1 else x64 * sigmoid


# (kernels, bytes per element moved, temporaries alive at the peak incl. the output) for fp32 data:
# each elementary op reads its operands and writes one full-size result.
_EAGER_MODEL = {
    "relu": (1, 8, 1),  # clamp_min: read 4, write 4
    "sigmoid": (4, 32, 2),  # neg, exp, add, reciprocal: 4 x (read 4 + write 4); two buffers alive at once
    "swish": (2, 20, 2),  # sigmoid (read 4, write 4) + mul (read 8, write 4); sigmoid(x) and the output alive
}


def activation_byte_model(element_bytes: int = 4) -> pd.DataFrame:
    """Predicted kernels, DRAM bytes per element and peak extra memory (in output sizes) per provider.

    ``eager`` follows :func:`activation_eager`; ``torch_op`` and ``triton`` are one pass (read x,
    write y) with only the output allocated.
    """
    rows = []
    scale = element_bytes / 4
    for name, (kernels, bytes_per_element, buffers) in _EAGER_MODEL.items():
        rows.append({"activation": name, "variant": "eager", "kernels": kernels,
                     "bytes_per_element": bytes_per_element * scale, "peak_buffers": buffers})
        for variant in ("torch_op", "triton"):
            rows.append({"activation": name, "variant": variant, "kernels": 1,
                         "bytes_per_element": 2 * element_bytes, "peak_buffers": 1})
    return pd.DataFrame(rows)
