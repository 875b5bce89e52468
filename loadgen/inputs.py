"""The request tensors: shapes from model metadata and ``--shape``, data per ``--input-data``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from loadgen.engine import InputTensor


class InputError(ValueError):
    """Inputs that cannot be built; the message says which and why."""


def parse_shapes(specs: list[str]) -> dict[str, list[int]]:
    """``--shape NAME:D1,D2`` (repeatable), dims without the batch dimension."""
    out: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        try:
            shape = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            shape = []
        if not sep or not name or not shape or any(d <= 0 for d in shape):
            raise InputError(f"--shape {spec!r}: expected NAME:DIM[,DIM...] with positive dims")
        out[name] = shape
    return out


def build_inputs(
    metadata: dict[str, Any],
    config: dict[str, Any],
    *,
    batch_size: int,
    shapes: dict[str, list[int]],
    input_data: str,
    rng: np.random.Generator,
) -> list[InputTensor]:
    """One tensor per model input, batched when the model batches."""
    if batch_size < 1:
        raise InputError(f"-b must be >= 1, got {batch_size}")
    max_batch = int(config.get("max_batch_size", 0))
    batching = max_batch > 0
    if batching and batch_size > max_batch:
        raise InputError(f"-b {batch_size} exceeds the model's max_batch_size {max_batch}")
    if batch_size > 1 and not batching:
        raise InputError(
            f"the model does not batch (max_batch_size 0); -b {batch_size} needs one that does"
        )
    file_values = _load_file(input_data) if input_data not in ("zero", "random") else {}
    tensors = []
    for spec in metadata.get("inputs", []):
        name, datatype = spec["name"], spec["datatype"]
        dims = [int(d) for d in spec["shape"]]
        if batching and dims and dims[0] == -1:
            dims = dims[1:]
        if name in shapes:
            dims = shapes[name]
        if any(d < 0 for d in dims):
            raise InputError(
                f"input {name!r} has a variable shape {dims}; give --shape {name}:DIMS"
            )
        shape = [batch_size, *dims] if batching else dims
        dtype = triton_to_np_dtype(datatype)
        if dtype is None or datatype == "BYTES":
            raise InputError(
                f"input {name!r}: datatype {datatype} is not supported by this generator"
            )
        if name in file_values:
            one = np.asarray(file_values[name], dtype=dtype).reshape(dims)
            data = np.broadcast_to(one, shape).copy() if batching else one
        elif input_data == "zero":
            data = np.zeros(shape, dtype=dtype)
        elif np.issubdtype(dtype, np.floating):
            data = rng.random(shape).astype(dtype)
        elif dtype == np.bool_:
            data = rng.integers(0, 2, shape).astype(dtype)
        else:
            data = rng.integers(0, 100, shape).astype(dtype)
        tensors.append(InputTensor(name, datatype, data))
    if file_values and not set(file_values) & {t.name for t in tensors}:
        raise InputError(
            f"{input_data}: none of its inputs ({', '.join(file_values)}) is the model's"
        )
    return tensors


def _load_file(path: str) -> dict[str, Any]:
    """perf_analyzer's JSON input format: ``{"data": [{"NAME": [...] | {"content": [...]}}]}``;
    the first entry is used."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError(f"--input-data {path!r}: no such file (or use zero / random)") from None
    except json.JSONDecodeError as err:
        raise InputError(f"--input-data {path}: not JSON ({err})") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        raise InputError(f'--input-data {path}: expected {{"data": [{{"INPUT": [...]}}]}}')
    out = {}
    for name, value in entries[0].items():
        out[name] = value["content"] if isinstance(value, dict) else value
    return out
