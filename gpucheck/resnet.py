"""The model the GPU check serves: torchvision's ResNet-50 with random weights (seeded, nothing
downloaded), on CUDA, in a real Triton through PyTriton (bound in the Triton child process)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

RESNET = "resnet50"
INPUT_SHAPE = (3, 224, 224)
CLASSES = 1000
MAX_BATCH = 8


def bind_resnet(triton: Any, state_path: str, instances: int) -> None:
    """An :data:`api.embedded.Binder`: ResNet-50 on ``cuda`` as model ``resnet50``."""
    import torch
    import torchvision
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor

    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval().to("cuda")

    @batch  # type: ignore[untyped-decorator]
    def infer(INPUT0: npt.NDArray[np.float32]) -> dict[str, npt.NDArray[np.float32]]:  # noqa: N803
        with torch.inference_mode():
            logits = model(torch.from_numpy(INPUT0).to("cuda", non_blocking=True))
            return {"OUTPUT0": logits.float().cpu().numpy()}

    triton.bind(
        RESNET,
        infer,
        inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=INPUT_SHAPE)],
        outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(CLASSES,))],
        config=ModelConfig(
            max_batch_size=MAX_BATCH,
            # two priority levels, the lower the default: the sidecar sends each request's
            # level as Triton's priority, and the check measures two levels through it
            batcher=DynamicBatcher(
                max_queue_delay_microseconds=0, priority_levels=2, default_priority_level=2
            ),
        ),
    )
