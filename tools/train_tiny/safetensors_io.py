"""Minimal safetensors writer and reader (Debian 12 has no safetensors package).

File layout: u64 little-endian N, then an N-byte UTF-8 JSON header, then the tensor bytes.
The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
relative to the end of the header) plus an optional "__metadata__" string map. We write the
tensors in name order, contiguously, and pad the header with spaces to a multiple of 8 bytes
so the data starts 8-byte aligned (as the reference implementation does).
"""
import json
import struct

import numpy as np
import torch

# dtype name -> (numpy dtype used to carry the raw little-endian bytes, bytes per element)
DTYPES = {
    "F32": ("<f4", 4),
    "F64": ("<f8", 8),
    "BF16": ("<u2", 2),
    "F16": ("<f2", 2),
    "I32": ("<i4", 4),
    "I64": ("<i8", 8),
}


def bf16_bits(t):
    """Round-to-nearest-even float32 -> bfloat16, returned as uint16 numpy bits."""
    return t.detach().to(torch.float32).contiguous().to(torch.bfloat16).view(torch.int16) \
        .numpy().view(np.uint16)


def encode_tensor(t, dtype):
    """Returns the raw little-endian bytes of t stored as `dtype`. t is a torch tensor, or a
    numpy array already holding the stored values (for BF16: the uint16 bits), as parse()
    returns them."""
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t).astype(DTYPES[dtype][0]).tobytes()
    if dtype == "BF16":
        return bf16_bits(t).astype("<u2").tobytes()
    np_t = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32,
            "I64": np.int64}[dtype]
    return t.detach().cpu().numpy().astype(np_t).astype(DTYPES[dtype][0]).tobytes()


def serialize(tensors, metadata=None):
    """tensors: {name: (tensor or stored array, dtype name)} -> bytes of a safetensors file."""
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t, dtype = tensors[name]
        raw = encode_tensor(t, dtype)
        assert len(raw) == int(np.prod(t.shape)) * DTYPES[dtype][1]
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)
    return struct.pack("<Q", len(hjson)) + hjson + b"".join(blobs)


def write(path, tensors, metadata=None):
    data = serialize(tensors, metadata)
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def parse(data):
    """bytes -> ({name: (numpy array in its stored dtype, dtype name)}, metadata)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        np_dt, size = DTYPES[info["dtype"]]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        if e - b != count * size:
            raise ValueError(f"{name}: {e - b} bytes for shape {info['shape']}")
        arr = np.frombuffer(data[base + b:base + e], dtype=np_dt).reshape(info["shape"])
        out[name] = (arr, info["dtype"])
    return out, meta


def to_float32(arr, dtype):
    """A stored array -> float32 torch tensor (bf16 bits are widened exactly)."""
    if dtype == "BF16":
        bits = arr.astype(np.uint32) << 16
        return torch.from_numpy(bits.view(np.float32).copy())
    return torch.from_numpy(np.asarray(arr, dtype=np.float32).copy())


def read(path):
    with open(path, "rb") as f:
        return parse(f.read())
