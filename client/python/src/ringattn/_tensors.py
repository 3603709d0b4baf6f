"""Host tensors on the wire: numpy / PyTorch inputs, wire dtypes, conversions.

Internal. Inputs are numpy arrays or PyTorch tensors of [B, N, H, D] (or
[N, H, D]); they are read a chunk of token rows at a time and converted to the
wire dtype (fp32, fp16 or bf16, little endian) only chunk by chunk, so a
request never holds a second full copy of a tensor.
"""

import sys

import numpy as np

from .errors import InvalidArgumentError

FP32, FP16, BF16 = "fp32", "fp16", "bf16"
WIRE_ITEMSIZE = {FP32: 4, FP16: 2, BF16: 2}
# How wire values are held in numpy: bf16 as its bit patterns.
WIRE_NUMPY_DTYPE = {FP32: np.dtype("<f4"), FP16: np.dtype("<f2"),
                    BF16: np.dtype("<u2")}

_WIRE_ALIASES = {
    "fp32": FP32, "float32": FP32, "f32": FP32, "float": FP32,
    "fp16": FP16, "float16": FP16, "f16": FP16, "half": FP16,
    "bf16": BF16, "bfloat16": BF16,
}


def _torch():
    """The torch module if the caller has imported it, else None."""
    return sys.modules.get("torch")


def is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_dtype_name(dtype):
    torch = _torch()
    return {
        torch.float32: FP32,
        torch.float16: FP16,
        torch.bfloat16: BF16,
        torch.float64: "fp64",
    }.get(dtype)


def _numpy_dtype_name(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return FP32
    if dtype == np.float16:
        return FP16
    if dtype == np.float64:
        return "fp64"
    if dtype.name == "bfloat16" and dtype.itemsize == 2:  # ml_dtypes.bfloat16
        return BF16
    return None


def dtype_name(x, what):
    """fp32, fp16, bf16 or fp64 for a supported tensor; InvalidArgumentError else."""
    if is_torch(x):
        name = _torch_dtype_name(x.dtype)
    elif isinstance(x, np.ndarray):
        name = _numpy_dtype_name(x.dtype)
    else:
        raise InvalidArgumentError(
            f"{what} must be a numpy array or a torch.Tensor, got "
            f"{type(x).__name__}")
    if name is None:
        raise InvalidArgumentError(
            f"{what} has dtype {x.dtype}; supported are float32, float16 and "
            "bfloat16 (float64 is sent as float32)")
    return name


def parse_wire_dtype(value, default, what="wire_dtype"):
    """The wire dtype ("fp32"/"fp16"/"bf16") that `value` names (None: default).

    `what` names the argument in the error for anything else.
    """
    if value is None:
        return FP32 if default == "fp64" else default
    if isinstance(value, str):
        name = _WIRE_ALIASES.get(value.lower())
    else:
        torch = _torch()
        if torch is not None and isinstance(value, torch.dtype):
            name = _torch_dtype_name(value)
        else:
            try:
                name = _numpy_dtype_name(value)
            except TypeError:
                name = None
    if name not in WIRE_ITEMSIZE:
        raise InvalidArgumentError(
            f"{what} must be fp32, fp16 or bf16, got {value!r}")
    return name


def shape_of(x):
    return tuple(int(s) for s in x.shape)


def as_4d(x):
    """A [B, N, H, D] view of a [N, H, D] or [B, N, H, D] tensor (no copy)."""
    if len(x.shape) == 4:
        return x
    return x.unsqueeze(0) if is_torch(x) else x[np.newaxis]


def float32_to_bf16_bits(a):
    """fp32 -> bf16 bit patterns (uint16), round to nearest even, NaN kept quiet."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    bits = a.view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) >> 16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return out


def bf16_bits_to_float32(bits):
    """bf16 bit patterns (uint16) -> fp32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(
        np.float32)


def wire_to_float32(data, wire):
    """float32 values of wire bytes or of an array of WIRE_NUMPY_DTYPE[wire]
    (exact for every dtype)."""
    values = (data if isinstance(data, np.ndarray) else
              np.frombuffer(data, dtype=WIRE_NUMPY_DTYPE[wire]))
    if wire == FP16:
        return values.astype(np.float32)
    if wire == BF16:
        return bf16_bits_to_float32(values)
    return values


def round_to_wire(a, wire):
    """`a` as float32 after a round trip through the wire dtype (for references)."""
    a = np.asarray(a, dtype=np.float32)
    if wire == FP16:
        return a.astype("<f2").astype(np.float32)
    if wire == BF16:
        return bf16_bits_to_float32(float32_to_bf16_bits(a))
    return a


def rows_to_wire(x, batch, begin, end, wire):
    """Token rows [begin, end) of batch entry `batch` of 4-D `x` in the wire
    dtype: a C-contiguous little-endian numpy array (WIRE_NUMPY_DTYPE), a
    view of `x` where no conversion is needed."""
    if is_torch(x):
        torch = _torch()
        rows = x[batch, begin:end].detach()
        if rows.device.type != "cpu":
            rows = rows.to("cpu")
        if wire == FP32:
            array = rows.to(torch.float32).contiguous().numpy()
        elif wire == FP16:
            array = rows.to(torch.float16).contiguous().numpy()
        else:
            array = rows.to(torch.bfloat16).contiguous().view(
                torch.int16).numpy().view(np.uint16)
        return np.ascontiguousarray(array).astype(
            array.dtype.newbyteorder("<"), copy=False)
    rows = x[batch, begin:end]
    source = _numpy_dtype_name(rows.dtype)
    if wire == FP32:
        return np.ascontiguousarray(rows, dtype="<f4")
    if wire == FP16:
        if source == BF16:
            rows = rows.astype(np.float32)
        return np.ascontiguousarray(rows, dtype="<f2")
    if source == BF16:
        return np.ascontiguousarray(rows).view(np.uint16).astype(
            "<u2", copy=False)
    return float32_to_bf16_bits(rows).astype("<u2", copy=False)


def like(array, reference):
    """float32 numpy `array` as the same kind as `reference`: numpy in ->
    numpy out, torch in -> torch out (on the reference's device)."""
    if is_torch(reference):
        out = _torch().from_numpy(array)
        return out if reference.device.type == "cpu" else out.to(
            reference.device)
    return array


def output_like(values, wire, reference):
    """Wire values (WIRE_NUMPY_DTYPE[wire]) as an output for `reference`.

    The same kind as the reference (numpy or torch, on its device), of its
    dtype if that is fp16/bf16, else float32 (exact from any wire dtype).
    Where the wire dtype is the result's, no value is copied on the host.
    """
    name = dtype_name(reference, "the reference")
    if is_torch(reference):
        torch = _torch()
        if wire == BF16:
            out = torch.from_numpy(values.view(np.int16)).view(torch.bfloat16)
        else:
            out = torch.from_numpy(values)
        target = reference.dtype if name in (FP16, BF16) else torch.float32
        if reference.device.type != "cpu":
            return out.to(reference.device, target)
        return out.to(target)
    if name in (FP16, BF16):
        if wire == BF16 and name == BF16:
            return values.view(reference.dtype)
        if wire == FP16 and name == FP16:
            return values
        values = wire_to_float32(values, wire)
        return values.astype(reference.dtype)
    return wire_to_float32(values, wire)


def to_float64(x):
    """A float64 numpy copy of a numpy array or torch tensor (any float dtype)."""
    if is_torch(x):
        torch = _torch()
        return x.detach().to("cpu", torch.float64).numpy()
    x = np.asarray(x)
    if _numpy_dtype_name(x.dtype) == BF16:
        return x.astype(np.float32).astype(np.float64)
    return x.astype(np.float64)
