"""Attention pattern options shared by the client and the reference.

`BlockSparse` is the public dataclass form of the block-sparse rules; the
parse_* helpers accept the loose forms `Client.attend` documents (dicts,
tuples, strings) and return canonical values, raising InvalidArgumentError
(a ValueError) on malformed ones. Semantic checks that need the shapes (for
example Hq % Hkv) are left to the server and the reference.
"""

import dataclasses
from typing import Optional, Sequence, Tuple

from .errors import InvalidArgumentError

LSE = "lse"
HEAD_GROUPS = "head_groups"

_UINT64_LIMIT = 1 << 64


@dataclasses.dataclass(frozen=True)
class BlockSparse:
    """Block-sparse attention rules (DESIGN.md "Block-sparse").

    A (query block i, key block j) pair of `block_size`-token blocks is computed
    iff any enabled rule allows it:
      local:   |i - j| <= local (None: off; 0: the diagonal only)
      global_: i < global_ or j < global_ (0: off)
      dilated: (i - j) % dilated == 0 (0: off)
      random:  this many extra key blocks per query block, drawn from `seed`
      pairs:   explicit (query block, key block) pairs
    With return_mask, the server returns the mask used (see
    Client.last_summary.block_mask). Causal masking still applies per token.
    """

    block_size: int
    local: Optional[int] = None
    global_: int = 0
    dilated: int = 0
    random: int = 0
    seed: int = 0
    pairs: Sequence[Tuple[int, int]] = ()
    return_mask: bool = False


def _int(value, what):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InvalidArgumentError(f"{what} must be an integer, got {value!r}")
    return int(value.__index__())


def parse_block_sparse(value):
    """A BlockSparse from a BlockSparse, a dict of its fields, or None."""
    if value is None or isinstance(value, BlockSparse):
        result = value
    elif isinstance(value, dict):
        fields = dict(value)
        if "global" in fields:
            if "global_" in fields:
                raise InvalidArgumentError(
                    "block_sparse gives both 'global' and 'global_'")
            fields["global_"] = fields.pop("global")
        known = {f.name for f in dataclasses.fields(BlockSparse)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise InvalidArgumentError(
                f"block_sparse has unknown keys {unknown}; known are "
                f"{sorted(known)}")
        if "block_size" not in fields:
            raise InvalidArgumentError("block_sparse needs a block_size")
        result = BlockSparse(**fields)
    else:
        raise InvalidArgumentError(
            "block_sparse must be a dict or a ringattn.BlockSparse, got "
            f"{type(value).__name__}")
    if result is None:
        return None
    seed = _int(result.seed, "block_sparse seed")
    if not 0 <= seed < _UINT64_LIMIT:
        raise InvalidArgumentError(
            f"block_sparse seed must be in [0, 2**64), got {seed}")
    pairs = []
    for pair in result.pairs:
        try:
            i, j = pair
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                f"block_sparse pairs must be (query_block, key_block) pairs, "
                f"got {pair!r}") from None
        pairs.append((_int(i, "a block_sparse pair"),
                      _int(j, "a block_sparse pair")))
    return BlockSparse(
        block_size=_int(result.block_size, "block_sparse block_size"),
        local=None if result.local is None else _int(result.local,
                                                     "block_sparse local"),
        global_=_int(result.global_, "block_sparse global_"),
        dilated=_int(result.dilated, "block_sparse dilated"),
        random=_int(result.random, "block_sparse random"),
        seed=seed,
        pairs=tuple(pairs),
        return_mask=bool(result.return_mask),
    )


def parse_dilated(value):
    """A tuple of (segment_length, dilation) int pairs from a list of pairs."""
    if value is None:
        return ()
    branches = []
    for branch in value:
        if isinstance(branch, dict):
            branch = (branch.get("segment_length"), branch.get("dilation"))
        try:
            w, r = branch
        except (TypeError, ValueError):
            raise InvalidArgumentError(
                "dilated must be a list of (segment_length, dilation) pairs, "
                f"got {branch!r}") from None
        branches.append((_int(w, "a dilated segment_length"),
                         _int(r, "a dilated dilation")))
    return tuple(branches)


def parse_combine(value):
    """"lse" or "head_groups" from a case-insensitive name."""
    name = str(value).lower()
    if name.startswith("combine_"):
        name = name[len("combine_"):]
    if name not in (LSE, HEAD_GROUPS):
        raise InvalidArgumentError(
            f"dilated_combine must be 'lse' or 'head_groups', got {value!r}")
    return name


def parse_hilbert(value):
    """(height, width) from a pair, a dict, or None."""
    if value is None:
        return None
    if isinstance(value, dict):
        value = (value.get("height"), value.get("width"))
    try:
        height, width = value
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"hilbert must be a (height, width) pair, got {value!r}") from None
    return (_int(height, "hilbert height"), _int(width, "hilbert width"))
