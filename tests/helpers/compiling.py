"""A torch.compile backend for tests that look at what a compiled call was made of."""

from __future__ import annotations

from typing import Any

import torch


class GraphRecorder:
    """A torch.compile backend that keeps each graph dynamo hands it (`graphs`) and runs it as
    traced, so a test can look at the operators a compiled call was made of."""

    def __init__(self) -> None:

        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: Any, example_inputs: object) -> Any:
        self.graphs.append(gm)
        return gm.forward
