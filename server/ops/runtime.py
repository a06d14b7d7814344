"""Runtime: the handle on what serves requests (the engine, the harmony encoding, the model name).

Built at start-up by server.ops.startup; the app keeps it on `app.state.runtime`, where the API
reads it. Importing it loads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from openai_harmony import HarmonyEncoding

from server.engine.base import Engine
from server.engine.loading.placement import Placement


@dataclass
class Runtime:
    engine: Engine
    encoding: HarmonyEncoding
    model_name: str
    placement: Placement | None = None  # where the model went (GPU layers, experts on CPU)

    def close(self) -> None:
        self.engine.close()
