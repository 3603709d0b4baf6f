"""A small float64 numpy reference of ringattn's attention semantics.

`attention()` computes what the service computes (DESIGN.md "Semantics"), in
float64, densely and without any cleverness, for checking results on small
shapes. It mirrors the C++ reference (kernels/cpu/reference_attention.cc):

* Q [B, Nq, Hq, D], K and V [B, Nk, Hkv, D] (or without the batch dimension),
  Hq % Hkv == 0; query head h reads K/V head h // (Hq // Hkv).
* causal: query i sees key j iff j <= i + (Nk - Nq) (bottom-right aligned).
* A query row that sees no key gives O = 0 and LSE = -inf.
* dilated (LongNet) branches combined by log-sum-exp or by head groups.
* block-sparse rules, including random blocks drawn exactly as
  core/block_mask.cc draws them (`block_mask()`).
* Hilbert ordering over an H x W grid with core/hilbert.cc's generalized
  Hilbert curve (`hilbert_order()`): masks and patterns apply in curve order,
  O and LSE come back in the caller's order.
* The scale is rounded to float32, as the service's is.

Memory is O(B * Hq * Nq * Nk) doubles: meant for N up to a few thousand.
"""

import numpy as np

from . import _spec, _tensors

__all__ = ["attention", "block_mask", "hilbert_order",
           "inverse_permutation"]

_MASK64 = (1 << 64) - 1


# --------------------------------------------------------------------------
# Generalized Hilbert curve (a port of core/hilbert.cc).

def _sign(value):
    return (value > 0) - (value < 0)


def _floor_half(value):
    return value // 2  # Python's // already rounds toward negative infinity


def _fill_rectangle(x, y, ax, ay, bx, by, width, order):
    major = abs(ax + ay)
    minor = abs(bx + by)
    dax, day = _sign(ax), _sign(ay)
    dbx, dby = _sign(bx), _sign(by)
    if minor == 1:
        for i in range(major):
            order.append((y + i * day) * width + (x + i * dax))
        return
    if major == 1:
        for i in range(minor):
            order.append((y + i * dby) * width + (x + i * dbx))
        return
    ax2, ay2 = _floor_half(ax), _floor_half(ay)
    bx2, by2 = _floor_half(bx), _floor_half(by)
    if 2 * major > 3 * minor:
        if abs(ax2 + ay2) % 2 != 0 and major > 2:
            ax2 += dax
            ay2 += day
        _fill_rectangle(x, y, ax2, ay2, bx, by, width, order)
        _fill_rectangle(x + ax2, y + ay2, ax - ax2, ay - ay2, bx, by, width,
                        order)
        return
    if abs(bx2 + by2) % 2 != 0 and minor > 2:
        bx2 += dbx
        by2 += dby
    _fill_rectangle(x, y, bx2, by2, ax2, ay2, width, order)
    _fill_rectangle(x + bx2, y + by2, ax, ay, bx - bx2, by - by2, width, order)
    _fill_rectangle(x + (ax - dax) + (bx2 - dbx), y + (ay - day) + (by2 - dby),
                    -bx2, -by2, -(ax - ax2), -(ay - ay2), width, order)


def hilbert_order(height, width):
    """The cells of a height x width grid in generalized Hilbert curve order.

    order[t] = row * width + col of the t-th cell visited: a permutation of
    0 .. height * width - 1 starting at cell (0, 0), exactly as
    core/hilbert.cc's HilbertOrder. Returns an int64 array.
    """
    height, width = int(height), int(width)
    order = []
    if height > 0 and width > 0:
        if width >= height:
            _fill_rectangle(0, 0, width, 0, 0, height, width, order)
        else:
            _fill_rectangle(0, 0, 0, height, width, 0, width, order)
    return np.asarray(order, dtype=np.int64)


def inverse_permutation(permutation):
    """result[permutation[i]] = i."""
    permutation = np.asarray(permutation, dtype=np.int64)
    inverse = np.empty_like(permutation)
    inverse[permutation] = np.arange(len(permutation), dtype=np.int64)
    return inverse


# --------------------------------------------------------------------------
# Block-sparse mask (a port of core/block_mask.cc).

def _splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def block_mask(seq_len, block_sparse=None, **rules):
    """The block mask [nb, nb] (bool; row = query block) for seq_len positions.

    `block_sparse` is a ringattn.BlockSparse or a dict of its fields; keyword
    arguments may give the fields instead (block_mask(100, block_size=8,
    local=1)). Query block i draws min(random, nb) distinct key blocks by a
    partial Fisher-Yates shuffle of 0 .. nb-1 driven by SplitMix64 with state
    seed ^ (0xD1B54A32D192ED03 * (i + 1)), as core/block_mask.cc does.
    Raises ValueError for rules the service would reject.
    """
    if block_sparse is None:
        block_sparse = rules
    elif rules:
        raise ValueError("give block_sparse or keyword rules, not both")
    bs = _spec.parse_block_sparse(block_sparse)
    if bs.block_size < 1:
        raise ValueError(f"block_sparse block_size must be >= 1, got "
                         f"{bs.block_size}")
    for name in ("global_", "dilated", "random"):
        if getattr(bs, name) < 0:
            raise ValueError(f"block_sparse {name} must be >= 0, got "
                             f"{getattr(bs, name)}")
    if bs.local is not None and bs.local < 0:
        raise ValueError(f"block_sparse local must be >= 0, got {bs.local}")
    if (bs.local is None and bs.global_ == 0 and bs.dilated == 0
            and bs.random == 0 and not bs.pairs):
        raise ValueError("block_sparse must enable at least one rule (local, "
                         "global, dilated, random or pairs)")
    nb = (int(seq_len) + bs.block_size - 1) // bs.block_size
    i = np.arange(nb)[:, None]
    j = np.arange(nb)[None, :]
    distance = np.abs(i - j)
    mask = np.zeros((nb, nb), dtype=bool)
    if bs.local is not None:
        mask |= distance <= bs.local
    mask |= (i < bs.global_) | (j < bs.global_)
    if bs.dilated > 0:
        mask |= distance % bs.dilated == 0
    if bs.random > 0:
        draws = min(bs.random, nb)
        for row in range(nb):
            state = bs.seed ^ ((0xD1B54A32D192ED03 * (row + 1)) & _MASK64)
            candidates = list(range(nb))
            for d in range(draws):
                state, value = _splitmix64(state)
                pick = d + value % (nb - d)
                candidates[d], candidates[pick] = candidates[pick], candidates[d]
                mask[row, candidates[d]] = True
    for q_block, k_block in bs.pairs:
        if not (0 <= q_block < nb and 0 <= k_block < nb):
            raise ValueError(
                f"block_sparse pair ({q_block}, {k_block}) must name blocks in "
                f"[0, {nb}) for {seq_len} positions in blocks of "
                f"{bs.block_size}")
        mask[q_block, k_block] = True
    return mask


# --------------------------------------------------------------------------
# Attention.

def _masked_attention(q, k, v, mask, scale):
    """Softmax attention of q [B, Nq, D] over k, v [B, Nk, D] under mask.

    mask broadcasts to [B, Nq, Nk]. Returns O [B, Nq, D] and LSE [B, Nq];
    rows that see no key get O = 0 and LSE = -inf.
    """
    scores = np.einsum("bqd,bkd->bqk", q, k) * scale
    scores = np.where(mask, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    empty = np.isneginf(row_max)
    shifted = np.exp(scores - np.where(empty, 0.0, row_max))
    total = shifted.sum(axis=-1, keepdims=True)
    out = np.einsum("bqk,bkd->bqd", shifted, v) / np.where(empty, 1.0, total)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, row_max + np.log(total))[..., 0]
    return out, lse


def _merge(o_acc, lse_acc, o, lse):
    """Log-sum-exp merge of two partial results (O [..., D], LSE [...])."""
    new = np.logaddexp(lse_acc, lse)
    safe = np.where(np.isneginf(new), 0.0, new)
    w_acc = np.exp(lse_acc - safe)[..., None]
    w = np.exp(lse - safe)[..., None]
    return o_acc * w_acc + o * w, new


def _check_shapes(q, k, v):
    shapes = [_tensors.shape_of(t) for t in (q, k, v)]
    ndims = {len(s) for s in shapes}
    if len(ndims) != 1 or ndims.pop() not in (3, 4):
        raise ValueError(
            "q, k and v must all be [B, N, H, D] or all [N, H, D], got shapes "
            f"{shapes[0]}, {shapes[1]}, {shapes[2]}")
    q4, k4, v4 = (s if len(s) == 4 else (1,) + s for s in shapes)
    if k4 != v4:
        raise ValueError(f"k and v must have the same shape, got {shapes[1]} "
                         f"and {shapes[2]}")
    if q4[0] != k4[0]:
        raise ValueError(f"q and k must have the same batch size, got "
                         f"{q4[0]} and {k4[0]}")
    if q4[3] != k4[3]:
        raise ValueError(f"q and k must have the same head_dim, got {q4[3]} "
                         f"and {k4[3]}")
    if min(q4 + k4) < 1:
        raise ValueError(f"every extent must be >= 1, got q {shapes[0]} and "
                         f"k {shapes[1]}")
    if q4[2] % k4[2] != 0:
        raise ValueError(f"q_heads ({q4[2]}) must be a multiple of kv_heads "
                         f"({k4[2]})")


def effective_scale(scale, head_dim):
    """The scale the service uses, as a Python float (rounded to float32)."""
    if scale is None:
        return float(np.float32(1.0) / np.sqrt(np.float32(head_dim)))
    return float(np.float32(scale))


def attention(q, k, v, causal=False, scale=None, dilated=None,
              dilated_combine="lse", block_sparse=None, hilbert=None):
    """Exact attention in float64; returns (O, LSE) as float64 numpy arrays.

    q [B, Nq, Hq, D] (or [Nq, Hq, D]), k and v [B, Nk, Hkv, D] (or 3-D), as
    numpy arrays or torch tensors of any float dtype. O has q's shape; LSE is
    [B, Hq, Nq] ([Hq, Nq] without a batch dimension), natural log, -inf where
    a row sees no key. The options are those of ringattn.Client.attend:
    dilated = [(segment_length, dilation), ...] with dilated_combine "lse" or
    "head_groups"; block_sparse = ringattn.BlockSparse or a dict; hilbert =
    (height, width). Raises ValueError for a request the service rejects.
    """
    _check_shapes(q, k, v)
    batched = len(q.shape) == 4
    q = _tensors.as_4d(_tensors.to_float64(q))
    k = _tensors.as_4d(_tensors.to_float64(k))
    v = _tensors.as_4d(_tensors.to_float64(v))
    batch, nq, hq, dim = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    scale = effective_scale(scale, dim)
    branches = _spec.parse_dilated(dilated)
    combine = _spec.parse_combine(dilated_combine)
    bs = _spec.parse_block_sparse(block_sparse)
    grid = _spec.parse_hilbert(hilbert)
    if (branches or bs is not None or grid is not None) and nq != nk:
        raise ValueError(f"q_len ({nq}) must equal kv_len ({nk}) when "
                         "dilated, block_sparse or hilbert is set")
    if branches and bs is not None:
        raise ValueError("block_sparse cannot be combined with dilated")
    for w, r in branches:
        if w < 1 or r < 1 or r > w:
            raise ValueError(f"dilated branch ({w}, {r}) needs segment_length "
                             ">= 1 and 1 <= dilation <= segment_length")
    if combine == _spec.HEAD_GROUPS and len(branches) > hq:
        raise ValueError(f"HEAD_GROUPS needs at most q_heads ({hq}) branches, "
                         f"got {len(branches)}")
    order = None
    if grid is not None:
        height, width = grid
        if height < 1 or width < 1 or height * width != nq:
            raise ValueError(f"hilbert height x width must equal the sequence "
                             f"length ({nq}), got {height} x {width}")
        order = hilbert_order(height, width)
        q, k, v = q[:, order], k[:, order], v[:, order]

    group = hq // hkv
    i = np.arange(nq)[:, None]
    j = np.arange(nk)[None, :]
    out = np.zeros((batch, nq, hq, dim))
    lse = np.full((batch, hq, nq), -np.inf)
    if not branches:
        mask = np.ones((nq, nk), dtype=bool)
        if causal:
            mask &= j <= i + (nk - nq)
        if bs is not None:
            blocks = block_mask(nk, bs)
            mask &= blocks[i // bs.block_size, j // bs.block_size]
        for h in range(hq):
            o_h, lse_h = _masked_attention(q[:, :, h], k[:, :, h // group],
                                           v[:, :, h // group], mask, scale)
            out[:, :, h], lse[:, h] = o_h, lse_h
    else:
        num_branches = len(branches)
        base, larger = divmod(hq, num_branches)
        for br, (w, r) in enumerate(branches):
            same_segment = (i // w) == (j // w)
            if combine == _spec.HEAD_GROUPS:
                first = br * base + min(br, larger)
                heads = range(first, first + base + (1 if br < larger else 0))
            else:
                heads = range(hq)
            for h in heads:
                offset = (h if combine == _spec.LSE else br) % r
                mask = (same_segment & ((i % w) % r == offset)
                        & ((j % w) % r == offset))
                if causal:
                    mask &= j <= i
                o_h, lse_h = _masked_attention(
                    q[:, :, h], k[:, :, h // group], v[:, :, h // group], mask,
                    scale)
                out[:, :, h], lse[:, h] = _merge(out[:, :, h], lse[:, h], o_h,
                                                 lse_h)
        if combine == _spec.HEAD_GROUPS:
            out /= num_branches

    if order is not None:
        unordered_out = np.empty_like(out)
        unordered_out[:, order] = out
        unordered_lse = np.empty_like(lse)
        unordered_lse[:, :, order] = lse
        out, lse = unordered_out, unordered_lse
    if not batched:
        out, lse = out[0], lse[0]
    return out, lse
