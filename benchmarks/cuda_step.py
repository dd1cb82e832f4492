"""A real training step for ``feedrate tune --step benchmarks/cuda_step.py:step`` on the images
example: a small convolutional classifier, forward and backward in bf16 autocast, one SGD step.

feedrate copies each batch to the device before calling it (``non_blocking`` when the settings
pin memory) and times the copy and the step with CUDA events. The model is built on the first
batch's device, so the same file runs on a CPU (slowly) for a dry run of ``benchmarks/gpu.sh``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional


def _block(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


def _model(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        _block(3, 64),
        _block(64, 128),
        _block(128, 256),
        _block(256, 512),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(512, classes),
    )


_state: dict[str, Any] = {}


def step(batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    """One training step on ``(images, labels)`` already on the device."""
    images, labels = batch
    if "model" not in _state:
        model = _model().to(images.device).to(memory_format=torch.channels_last)
        _state["model"] = model
        _state["opt"] = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, opt = _state["model"], _state["opt"]
    images = images.contiguous(memory_format=torch.channels_last)
    with torch.autocast(images.device.type, dtype=torch.bfloat16):
        loss = functional.cross_entropy(model(images), labels)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
