"""Check a KServe v2 inference request's tensors before Triton sees them.

Triton trusts a tensor's declared ``shape``: a body claiming ``[1, 1000000000000]`` made it
allocate for 10^12 elements and die (std::bad_alloc). So shapes, datatypes and data must agree
(JSON ``data`` counted, binary-extension ``binary_data_size`` summed against the bytes after the
JSON header), and a request's elements are bounded: per input by the model's configuration where
Triton gives one (``max_batch_size`` × the fixed dims), and per request by ``max_elements``.
Inputs in shared memory carry no data here; only their shape is bounded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from api.hints import BadRequestError

DTYPE_BYTES: dict[str, int | None] = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "BF16": 2,
    "FP32": 4,
    "FP64": 8,
    "BYTES": None,  # variable length: 4-byte length prefix + bytes per element
}
MAX_DIMS = 16
MAX_JSON_DEPTH = 64


@dataclass(frozen=True)
class ModelLimits:
    """Most elements one input of a model may hold, by input name (from Triton's config)."""

    max_elements: Mapping[str, int]

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelLimits:
        """From ``/v2/models/<m>/config``: ``max(1, max_batch_size) × prod(dims)`` per input
        whose dims are all fixed (a ``-1`` dim leaves that input to the request-wide bound)."""
        batch = config.get("max_batch_size", 0)
        batch = batch if isinstance(batch, int) and batch > 0 else 1
        limits: dict[str, int] = {}
        for spec in config.get("input", []) or []:
            if not isinstance(spec, dict):
                continue
            dims = spec.get("dims", [])
            try:
                numbers = [int(d) for d in dims]
            except (TypeError, ValueError):
                continue
            if isinstance(spec.get("name"), str) and all(d >= 0 for d in numbers):
                limits[spec["name"]] = batch * math.prod(numbers)
        return cls(limits)


def json_depth(obj: Any) -> int:
    """Nesting depth of a parsed JSON value (scalars 0), without recursion."""
    deepest, stack = 0, [(obj, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            deepest = max(deepest, depth + 1)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            deepest = max(deepest, depth + 1)
            stack.extend((v, depth + 1) for v in value)
    return deepest


def nesting_bound(raw: bytes) -> int:
    """A bound on the nesting depth of the JSON text ``raw``: its count of ``[`` and ``{``
    (each level opens one; those inside strings only raise the bound). Counting bytes costs
    far less than walking the parsed value."""
    return raw.count(b"[") + raw.count(b"{")


def _count_leaves(data: Any) -> int:
    """How many scalars a (possibly nested) JSON ``data`` list holds."""
    if not isinstance(data, list):
        return 1
    count, stack = 0, [data]
    while stack:
        for item in stack.pop():
            if isinstance(item, list):
                stack.append(item)
            elif isinstance(item, dict):
                raise BadRequestError("tensor data must be scalars or lists, not objects")
            else:
                count += 1
    return count


def _shape(name: str, shape: Any) -> list[int]:
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise BadRequestError(f"input {name!r}: shape must be a list of at most {MAX_DIMS} dims")
    for dim in shape:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise BadRequestError(f"input {name!r}: shape dims must be integers >= 0, got {shape}")
    return shape


class ElementBudget:
    """The element bounds of one request, input by input: each input by the model's config,
    all of them together by ``max_elements``; the same checks for every protocol."""

    def __init__(self, max_elements: int, model: ModelLimits | None) -> None:
        self.max_elements = max_elements
        self.model = model
        self.total = 0

    def take(self, name: str, datatype: str, shape: list[int]) -> int:
        """Check one input's datatype and shape against the bounds; its element count."""
        if datatype not in DTYPE_BYTES:
            raise BadRequestError(
                f"input {name!r}: datatype must be one of {', '.join(DTYPE_BYTES)}, "
                f"got {datatype!r}"
            )
        elements = math.prod(shape)
        bound = self.model.max_elements.get(name) if self.model is not None else None
        if bound is not None and elements > bound:
            raise BadRequestError(
                f"input {name!r}: shape {shape} has {elements} elements; "
                f"the model takes at most {bound}"
            )
        self.total += elements
        if self.total > self.max_elements:
            raise BadRequestError(
                f"the request's inputs have more than {self.max_elements} elements "
                f"(input {name!r}, shape {shape}); see --max-request-elements"
            )
        return elements


def check_binary_size(name: str, datatype: str, shape: list[int], elements: int, size: int) -> None:
    """A fixed-width input's bytes must be exactly its shape's."""
    width = DTYPE_BYTES[datatype]
    if width is not None and size != elements * width:
        raise BadRequestError(
            f"input {name!r}: shape {shape} of {datatype} is "
            f"{elements * width} bytes, but {size} bytes were sent"
        )


def check_request(
    request: Mapping[str, Any],
    binary_bytes: int,
    *,
    max_elements: int,
    model: ModelLimits | None = None,
    shallow: bool = False,
) -> None:
    """Raise :class:`BadRequestError` unless every input's shape, datatype and data agree and
    the counts are within bounds; ``binary_bytes`` is what follows the JSON header.
    ``shallow``: the caller knows the JSON nests no deeper than ``MAX_JSON_DEPTH`` (see
    :func:`nesting_bound`), so its depth is not walked."""
    if not shallow and json_depth(request) > MAX_JSON_DEPTH:
        raise BadRequestError(f"request JSON is nested deeper than {MAX_JSON_DEPTH}")
    if "id" in request and not isinstance(request["id"], str):
        raise BadRequestError("id must be a string")
    outputs = request.get("outputs", [])
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict)
        and isinstance(o.get("name"), str)
        and isinstance(o.get("parameters", {}), dict)
        for o in outputs
    ):
        raise BadRequestError("outputs must be a list of objects, each with a string name")
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadRequestError("inputs must be a non-empty list of tensors")
    budget = ElementBudget(max_elements, model)
    binary_total = 0
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise BadRequestError(f"inputs[{i}] must be a JSON object")
        name = tensor.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequestError(f"inputs[{i}].name must be a non-empty string")
        datatype = tensor.get("datatype")
        if not isinstance(datatype, str):
            datatype = repr(datatype)
        shape = _shape(name, tensor.get("shape"))
        elements = budget.take(name, datatype, shape)
        params = tensor.get("parameters") or {}
        if not isinstance(params, dict):
            raise BadRequestError(f"input {name!r}: parameters must be a JSON object")
        if "shared_memory_region" in params:
            continue
        if "binary_data_size" in params:
            size = params["binary_data_size"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise BadRequestError(f"input {name!r}: binary_data_size must be an integer >= 0")
            check_binary_size(name, datatype, shape, elements, size)
            binary_total += size
        elif "data" in tensor:
            count = _count_leaves(tensor["data"])
            if count != elements:
                raise BadRequestError(
                    f"input {name!r}: shape {tensor['shape']} has {elements} elements, "
                    f"but data has {count}"
                )
        else:
            raise BadRequestError(f"input {name!r} has no data (data or binary_data_size)")
    if binary_total != binary_bytes:
        raise BadRequestError(
            f"the inputs' binary_data_size add up to {binary_total} bytes, but {binary_bytes} "
            "bytes follow the JSON header"
        )
