"""Unit tests of ringattn.reference (no server): brute force, pinned layouts."""

import math

import numpy as np
import pytest

from ringattn import BlockSparse, reference

# --------------------------------------------------------------------------
# A brute-force transcription of DESIGN.md "Semantics", one query row at a
# time, to hold the vectorized reference to.


def _row(q_row, keys, values, scale):
    if len(keys) == 0:
        return np.zeros(len(q_row)), -math.inf
    scores = np.array([float(np.dot(q_row, key)) * scale for key in keys])
    top = scores.max()
    weights = np.exp(scores - top)
    total = weights.sum()
    out = sum(w * val for w, val in zip(weights, values)) / total
    return out, top + math.log(total)


def _allowed_by_rules(i, j, rules, nb, seq_len):
    distance = abs(i - j)
    if rules.local is not None and distance <= rules.local:
        return True
    if i < rules.global_ or j < rules.global_:
        return True
    if rules.dilated and distance % rules.dilated == 0:
        return True
    if (i, j) in set(rules.pairs):
        return True
    if rules.random:
        # Random draws are pinned separately (test_random_blocks_*).
        only_random = BlockSparse(block_size=rules.block_size,
                                  random=rules.random, seed=rules.seed)
        return bool(reference.block_mask(seq_len, only_random)[i, j])
    return False


def brute_force(q, k, v, causal=False, scale=None, dilated=(),
                combine="lse", block_sparse=None, hilbert=None):
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    batch, nq, hq, dim = q.shape
    nk, hkv = k.shape[1], k.shape[2]
    scale = float(np.float32(1 / math.sqrt(dim) if scale is None else scale))
    order = (np.arange(nq) if hilbert is None
             else reference.hilbert_order(*hilbert))
    if hilbert is not None:  # masks apply in curve order (Nq == Nk here)
        q, k, v = q[:, order], k[:, order], v[:, order]
    out = np.zeros(q.shape)
    lse = np.full((batch, hq, nq), -math.inf)
    for b in range(batch):
        for h in range(hq):
            kv_head = h // (hq // hkv)
            for i in range(nq):
                if not dilated:
                    keys = []
                    for j in range(nk):
                        if causal and j > i + nk - nq:
                            continue
                        if block_sparse is not None:
                            size = block_sparse.block_size
                            nb = -(-nk // size)
                            if not _allowed_by_rules(i // size, j // size,
                                                     block_sparse, nb, nk):
                                continue
                        keys.append(j)
                    o, l = _row(q[b, i, h], k[b, keys, kv_head],
                                v[b, keys, kv_head], scale)
                else:
                    groups = len(dilated)
                    parts = []
                    for br, (w, r) in enumerate(dilated):
                        if combine == "head_groups":
                            sizes = [hq // groups + (1 if g < hq % groups else 0)
                                     for g in range(groups)]
                            first = sum(sizes[:br])
                            if not first <= h < first + sizes[br]:
                                continue
                            offset = br % r
                        else:
                            offset = h % r
                        start = i // w * w
                        end = min(start + w, nq)
                        if (i - start) % r != offset:
                            continue
                        keys = [j for j in range(start, end)
                                if (j - start) % r == offset
                                and (not causal or j <= i)]
                        parts.append(_row(q[b, i, h], k[b, keys, kv_head],
                                          v[b, keys, kv_head], scale))
                    parts = [p for p in parts if p[1] != -math.inf]
                    if not parts:
                        o, l = np.zeros(dim), -math.inf
                    else:
                        l = max(p[1] for p in parts)
                        l += math.log(sum(math.exp(p[1] - l) for p in parts))
                        o = sum(math.exp(p[1] - l) * p[0] for p in parts)
                    if combine == "head_groups":
                        o = o / groups
                out[b, i, h] = o
                lse[b, h, i] = l
    result_out = np.empty_like(out)
    result_out[:, order] = out
    result_lse = np.empty_like(lse)
    result_lse[:, :, order] = lse
    return result_out, result_lse


def _qkv(seed, batch, nq, hq, dim, nk=None, hkv=None):
    rng = np.random.default_rng(seed)
    nk = nq if nk is None else nk
    hkv = hq if hkv is None else hkv
    return (rng.standard_normal((batch, nq, hq, dim)),
            rng.standard_normal((batch, nk, hkv, dim)),
            rng.standard_normal((batch, nk, hkv, dim)))


def _assert_same(actual, expected):
    (o, l), (eo, el) = actual, expected
    np.testing.assert_allclose(o, eo, rtol=1e-10, atol=1e-12)
    assert np.array_equal(np.isneginf(l), np.isneginf(el))
    finite = np.isfinite(el)
    np.testing.assert_allclose(l[finite], el[finite], rtol=1e-10, atol=1e-12)
    assert not np.isnan(o).any() and not np.isnan(l).any()


CASES = {
    "dense": dict(shape=(2, 7, 2, 3)),
    "causal": dict(shape=(1, 9, 2, 4), causal=True),
    "causal_nq_lt_nk": dict(shape=(1, 4, 2, 3), nk=11, causal=True),
    "causal_nq_gt_nk": dict(shape=(1, 10, 1, 3), nk=4, causal=True),
    "dense_nq_ne_nk": dict(shape=(1, 5, 2, 3), nk=8),
    "gqa": dict(shape=(1, 6, 6, 3), hkv=2, causal=True),
    "mqa": dict(shape=(2, 5, 3, 2), hkv=1),
    "scale": dict(shape=(1, 6, 1, 3), scale=0.37),
    "dilated_lse": dict(shape=(1, 13, 4, 3), dilated=[(4, 1), (6, 2), (13, 3)]),
    "dilated_lse_causal": dict(shape=(1, 11, 3, 2), dilated=[(5, 2), (8, 4)],
                               causal=True, hkv=1),
    "dilated_head_groups": dict(shape=(1, 13, 5, 3),
                                dilated=[(4, 1), (6, 2), (9, 3)],
                                combine="head_groups"),
    "dilated_head_groups_causal": dict(shape=(2, 10, 4, 2),
                                       dilated=[(3, 1), (7, 3)],
                                       combine="head_groups", causal=True),
    "block_local": dict(shape=(1, 11, 2, 3),
                        block_sparse=BlockSparse(block_size=3, local=0)),
    "block_all_rules": dict(shape=(1, 17, 2, 2), causal=True,
                            block_sparse=BlockSparse(
                                block_size=3, local=1, global_=1, dilated=3,
                                random=1, seed=99, pairs=((0, 5), (2, 4)))),
    "block_random_only": dict(shape=(1, 12, 1, 3),
                              block_sparse=BlockSparse(block_size=2, random=2,
                                                       seed=5)),
    "hilbert": dict(shape=(1, 15, 2, 3), hilbert=(3, 5), causal=True),
    "hilbert_blocks": dict(shape=(1, 16, 1, 3), hilbert=(4, 4),
                           block_sparse=BlockSparse(block_size=4, local=0,
                                                    pairs=((3, 0),))),
    "hilbert_dilated": dict(shape=(1, 12, 2, 2), hilbert=(4, 3),
                            dilated=[(5, 2)]),
    "single_token": dict(shape=(1, 1, 1, 1), causal=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_matches_brute_force(name):
    case = dict(CASES[name])
    batch, nq, hq, dim = case.pop("shape")
    q, k, v = _qkv(len(name), batch, nq, hq, dim, case.pop("nk", None),
                   case.pop("hkv", None))
    combine = case.pop("combine", "lse")
    expected = brute_force(q, k, v, combine=combine,
                           dilated=case.get("dilated") or (), **{
                               key: val for key, val in case.items()
                               if key != "dilated"})
    actual = reference.attention(q, k, v, dilated_combine=combine, **case)
    _assert_same(actual, expected)


def test_rows_that_see_no_key_give_zero_and_minus_infinity():
    q, k, v = _qkv(1, 1, 6, 2, 4, nk=2)
    o, l = reference.attention(q, k, v, causal=True)
    # Query i sees key j iff j <= i + 2 - 6: rows 0..3 see nothing.
    assert (o[:, :4] == 0).all() and np.isneginf(l[:, :, :4]).all()
    assert np.isfinite(l[:, :, 4:]).all()


def test_dilated_positions_kept_by_no_branch_are_zero():
    q, k, v = _qkv(2, 1, 8, 1, 2)
    o, l = reference.attention(q, k, v, dilated=[(8, 4)])
    # Head 0 keeps offsets 0 and 4 only.
    kept = [0, 4]
    dropped = [i for i in range(8) if i not in kept]
    assert (o[0, dropped] == 0).all() and np.isneginf(l[0, 0, dropped]).all()
    assert np.isfinite(l[0, 0, kept]).all()


def test_three_dimensional_inputs_drop_the_batch_dimension():
    q, k, v = _qkv(3, 1, 5, 2, 3)
    o, l = reference.attention(q[0], k[0], v[0], causal=True)
    o4, l4 = reference.attention(q, k, v, causal=True)
    assert o.shape == (5, 2, 3) and l.shape == (2, 5)
    np.testing.assert_array_equal(o, o4[0])
    np.testing.assert_array_equal(l, l4[0])


def test_dense_matches_a_plain_softmax_formula():
    q, k, v = _qkv(4, 2, 6, 3, 5, nk=9)
    o, l = reference.attention(q, k, v)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) * float(
        np.float32(1 / np.sqrt(np.float32(5))))
    lse = np.log(np.exp(scores).sum(-1))
    weights = np.exp(scores - lse[..., None])
    np.testing.assert_allclose(o, np.einsum("bhqk,bkhd->bqhd", weights, v),
                               rtol=1e-12)
    np.testing.assert_allclose(l, lse, rtol=1e-12)


def test_dilated_lse_of_one_full_branch_is_dense():
    q, k, v = _qkv(5, 1, 10, 2, 3)
    _assert_same(reference.attention(q, k, v, dilated=[(10, 1)]),
                 reference.attention(q, k, v))
    _assert_same(reference.attention(q, k, v, dilated=[(10, 1)],
                                     causal=True),
                 reference.attention(q, k, v, causal=True))


@pytest.mark.parametrize("kwargs, message", [
    (dict(), "q_heads"),
    (dict(dilated=[(4, 5)]), "dilated"),
    (dict(hilbert=(2, 3)), "hilbert"),
    (dict(block_sparse=dict(block_size=2)), "at least one rule"),
])
def test_invalid_requests_raise_value_error(kwargs, message):
    q, k, v = _qkv(6, 1, 8, 3, 2, hkv=3 if kwargs else 2)
    with pytest.raises(ValueError, match=message):
        reference.attention(q, k, v, **kwargs)


def test_mismatched_shapes_raise_value_error():
    q, k, v = _qkv(7, 1, 8, 2, 4)
    with pytest.raises(ValueError, match="same shape"):
        reference.attention(q, k, v[:, :5])
    with pytest.raises(ValueError, match="head_dim"):
        reference.attention(q[..., :3], k, v)
    with pytest.raises(ValueError, match="q_len"):
        reference.attention(q[:, :5], k, v, hilbert=(2, 4))


# --------------------------------------------------------------------------
# Hilbert curve: pinned layouts from core/hilbert_test.cc and its properties.

PINNED_LAYOUTS = {
    (6, 5): [0, 5, 10, 11, 6, 1, 2, 7, 8, 3, 4, 9, 14, 19, 18, 13, 12, 17, 22,
             23, 24, 29, 28, 27, 26, 21, 16, 15, 20, 25],
    (5, 6): [0, 1, 2, 8, 7, 6, 12, 13, 19, 18, 24, 25, 26, 27, 21, 20, 14, 15,
             16, 22, 28, 29, 23, 17, 11, 10, 9, 3, 4, 5],
    (10, 10): [
        0, 10, 20, 21, 11, 1, 2, 12, 13, 3, 4, 14, 24, 34, 33, 23, 22, 32, 42,
        43, 44, 54, 53, 52, 51, 41, 31, 30, 40, 50, 60, 61, 62, 72, 71, 70, 80,
        90, 91, 81, 82, 92, 93, 83, 84, 94, 95, 85, 75, 74, 73, 63, 64, 65, 66,
        67, 77, 76, 86, 96, 97, 87, 88, 98, 99, 89, 79, 78, 68, 69, 59, 58, 48,
        49, 39, 38, 37, 36, 46, 47, 57, 56, 55, 45, 35, 25, 15, 5, 6, 7, 17,
        16, 26, 27, 28, 29, 19, 18, 8, 9],
    (4, 5): [0, 1, 6, 5, 10, 15, 16, 11, 12, 17, 18, 19, 14, 13, 9, 8, 7, 2,
             3, 4],
}


@pytest.mark.parametrize("grid", sorted(PINNED_LAYOUTS))
def test_hilbert_order_matches_the_cpp_layouts(grid):
    assert reference.hilbert_order(*grid).tolist() == PINNED_LAYOUTS[grid]


def _steps(order, width):
    rows, cols = np.divmod(np.asarray(order), width)
    dr, dc = np.abs(np.diff(rows)), np.abs(np.diff(cols))
    return int(((dr + dc) == 1).sum()), int(((dr == 1) & (dc == 1)).sum())


def test_hilbert_order_is_a_connected_bijection_on_small_grids():
    for height in range(1, 18):
        for width in range(1, 18):
            order = reference.hilbert_order(height, width)
            assert sorted(order.tolist()) == list(range(height * width))
            assert order[0] == 0
            neighbour, diagonal = _steps(order, width)
            shorter, longer = min(height, width), max(height, width)
            expected_diagonal = int(shorter % 2 == 0 and shorter >= 4
                                    and longer % 2 == 1)
            assert diagonal == expected_diagonal, (height, width)
            assert neighbour + diagonal == height * width - 1, (height, width)


def test_hilbert_order_on_power_of_two_squares_is_the_hilbert_curve():
    order = reference.hilbert_order(16, 16)
    # Every run of 4^k cells fills one aligned 2^k x 2^k block.
    for block in (2, 4, 8):
        rows, cols = np.divmod(order.reshape(-1, block * block), 16)
        assert (rows // block == rows[:, :1] // block).all()
        assert (cols // block == cols[:, :1] // block).all()
    assert reference.hilbert_order(0, 3).tolist() == []
    assert reference.hilbert_order(1, 6).tolist() == list(range(6))


def test_inverse_permutation():
    order = reference.hilbert_order(7, 9)
    inverse = reference.inverse_permutation(order)
    assert (inverse[order] == np.arange(63)).all()


# --------------------------------------------------------------------------
# Block masks, with random draws pinned to what the C++ core draws (taken from
# the server's returned mask for the same rules).

PINNED_RANDOM_MASKS = {
    7: ["00100101", "00111000", "01000011", "10001010", "00111000", "11000001",
        "10000101", "10100100"],
    2**64 - 1: ["10100010", "01100001", "00010110", "00010011", "01000110",
                "10101000", "01100001", "01000011"],
}


@pytest.mark.parametrize("seed", sorted(PINNED_RANDOM_MASKS))
def test_random_blocks_match_the_cpp_draws(seed):
    mask = reference.block_mask(16, block_size=2, random=3, seed=seed)
    rows = ["".join(str(int(x)) for x in row) for row in mask]
    assert rows == PINNED_RANDOM_MASKS[seed]


def test_random_blocks_are_distinct_deterministic_and_capped():
    a = reference.block_mask(160, block_size=8, random=3, seed=7)
    assert (a.sum(axis=1) == 3).all()
    assert (a == reference.block_mask(160, dict(block_size=8, random=3,
                                                seed=7))).all()
    assert (a != reference.block_mask(160, block_size=8, random=3,
                                      seed=8)).any()
    assert reference.block_mask(20, block_size=8, random=100).sum() == 9


def test_block_rules_and_pairs():
    local = reference.block_mask(100, block_size=10, local=1)
    i, j = np.indices(local.shape)
    assert (local == (np.abs(i - j) <= 1)).all()
    glob = reference.block_mask(100, {"block_size": 10, "global": 2})
    assert (glob == ((i < 2) | (j < 2))).all()
    dil = reference.block_mask(100, block_size=10, dilated=3)
    assert (dil == ((i - j) % 3 == 0)).all()
    pairs = reference.block_mask(40, block_size=10, local=0,
                                 pairs=[(0, 3), (2, 1)])
    assert pairs[0, 3] and pairs[2, 1] and not pairs[3, 0]
    assert pairs.sum() == 4 + 2
    with pytest.raises(ValueError, match="pair"):
        reference.block_mask(40, block_size=10, pairs=[(0, 4)])
    with pytest.raises(ValueError, match="unknown keys"):
        reference.block_mask(40, {"block_size": 10, "locals": 1})
