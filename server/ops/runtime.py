"""Runtime: the handle on what serves requests (the engine, the harmony encoding, the model name,
the names it also answers to, and whether it is in memory).

Built at start-up by server.ops.startup; the app keeps it on `app.state.runtime`, where the API
reads it. Importing it loads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from openai_harmony import HarmonyEncoding

from server.engine.base import Engine
from server.engine.loading.placement import Placement
from server.ops.residency import ModelResidency, ResidencyReport


@dataclass
class Runtime:
    engine: Engine
    encoding: HarmonyEncoding
    model_name: str
    placement: Placement | None = None  # where the model went (GPU layers, experts on CPU)
    aliases: tuple[str, ...] = ()  # other names of the model (Ollama's, LM Studio's)
    residency: ModelResidency | None = None  # the engine, when --idle-unload may unload it

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the model answers to, its own first."""
        return tuple(dict.fromkeys((self.model_name, *self.aliases)))

    @property
    def residency_report(self) -> ResidencyReport:
        """Loaded, unloading, unloaded or loading (always loaded without --idle-unload)."""
        return self.residency.report if self.residency is not None else ResidencyReport()

    def close(self) -> None:
        self.engine.close()
