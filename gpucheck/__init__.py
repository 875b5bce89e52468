"""A read-only check of the whole stack on a real NVIDIA GPU (``scripts/gpu-check``)."""
