"""What an index costs (notebook 05): the one-hot term of cross-entropy's gradient, ``softmax - onehot(label)``, in
the two frames the project's kernels have used for the label test.

Each program takes one tile of one row. The label is an int64 loaded from memory and the tile starts at an int64
column ``start`` (plus a run-time ``head`` when the row is peeled: rows that are not 16-byte aligned). With
``LANE_FRAME=False`` each element's column ``lanes + start + head`` is compared with the label, as the fused and
split_row kernels did until 2026-11-26: a 64-bit add and a 64-bit compare per element. With ``LANE_FRAME=True`` the
label is moved into the tile once (``row_math.label_in_tile``: an int32 lane, -1 outside the tile) and compared with
the int32 lanes. The two write the same values; notebook 05 compiles both for sm_90 and counts the SASS.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.row_math import label_in_tile

__all__ = ["onehot_gradient_kernel", "onehot_gradient", "onehot_gradient_reference"]


@triton.jit
def onehot_gradient_kernel(q_ptr, labels_ptr, heads_ptr, out_ptr, n_cols, row_stride, BLOCK: tl.constexpr,
                           LANE_FRAME: tl.constexpr, HAS_HEAD: tl.constexpr):
    """out[row, c] = q[row, c] - (c == label[row]) over columns head + [tile*BLOCK, (tile+1)*BLOCK) of the row."""
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1).to(tl.int64) * BLOCK  # int64: row * stride + start can pass 2**31 elements
    head = 0
    if HAS_HEAD:  # a peeled row's head: columns before its first 16-byte boundary, known only at run time
        head = tl.load(heads_ptr + row)
    lanes = tl.arange(0, BLOCK)  # int32
    label = tl.load(labels_ptr + row).to(tl.int64)
    offsets = row * row_stride + head + start + lanes
    in_row = lanes < n_cols - head - start
    q = tl.load(q_ptr + offsets, mask=in_row, other=0.0).to(tl.float32)
    if LANE_FRAME:
        hit = lanes == label_in_tile(label, start + head, BLOCK)  # one int32 compare per element
    else:
        hit = lanes + start + head == label  # a 64-bit add and compare per element
    tl.store(out_ptr + offsets, (q - tl.where(hit, 1.0, 0.0)).to(out_ptr.dtype.element_ty), mask=in_row)


def onehot_gradient(q: torch.Tensor, labels: torch.Tensor, heads: torch.Tensor | None = None, *, block: int = 64,
                    lane_frame: bool = True) -> torch.Tensor:
    """``q - onehot(labels)`` for columns ``heads[r]`` onwards of each row (all columns when ``heads`` is None;
    the columns before a row's head are left 0)."""
    if q.dim() != 2 or labels.shape != (q.shape[0],):
        raise ValueError(f"q must be (rows, cols) and labels (rows,), got {tuple(q.shape)} and {tuple(labels.shape)}")
    if q.stride(1) != 1:
        raise ValueError("q's rows must be contiguous (stride 1 along the columns)")
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    has_head = heads is not None
    if has_head and (heads.shape != labels.shape or heads.dtype != torch.int32):
        raise ValueError("heads must be an int32 tensor with one entry per row")
    if labels.device != q.device or (has_head and heads.device != q.device):
        raise ValueError(f"labels (and heads) must be on q's device ({q.device}), got {labels.device}"
                         + (f" and {heads.device}" if has_head else ""))
    out = torch.zeros_like(q)
    grid = (q.shape[0], triton.cdiv(q.shape[1], block))
    onehot_gradient_kernel[grid](q, labels, heads if has_head else labels, out, q.shape[1], q.stride(0),
                                 BLOCK=block, LANE_FRAME=lane_frame, HAS_HEAD=has_head)
    return out


def onehot_gradient_reference(q: torch.Tensor, labels: torch.Tensor, heads: torch.Tensor | None = None) -> torch.Tensor:
    """The same in PyTorch, float64."""
    cols = torch.arange(q.shape[1], device=q.device)
    hit = (cols[None, :] == labels[:, None]).double()
    out = q.double() - hit
    if heads is not None:
        out = torch.where(cols[None, :] >= heads.long()[:, None], out, torch.zeros_like(out))
    return out
