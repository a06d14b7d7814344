"""Runtime: the handle on what serves requests (the engine, the harmony encoding, the model name,
the names it also answers to, and whether it is in memory); ServedModels: the runtimes of every
model one server serves, found by any of their names, and their memory budget.

Built at start-up by server.ops.startup; the app keeps them on `app.state.models` (the first
model's runtime also on `app.state.runtime`), where the API reads them. Importing it loads
nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from openai_harmony import HarmonyEncoding

from server.engine.base import Engine
from server.engine.loading.placement import Placement
from server.ops.fleet import FleetReport, ModelFleet
from server.ops.residency import ModelResidency, ResidencyReport


@dataclass
class Runtime:
    engine: Engine
    encoding: HarmonyEncoding
    model_name: str
    placement: Placement | None = None  # where the model went (GPU layers, experts on CPU)
    aliases: tuple[str, ...] = ()  # other names of the model (Ollama's, LM Studio's)
    residency: ModelResidency | None = None  # the engine, when it may be unloaded (idle, RPC)

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


@dataclass
class ServedModels:
    """The models a server serves: the first is the default (loaded at start, answering a
    request that names none); with one, any name is accepted (as a single-model server always
    did); with several, the fleet keeps them within the memory budget."""

    runtimes: tuple[Runtime, ...]
    fleet: ModelFleet | None = None

    @property
    def default(self) -> Runtime:
        return self.runtimes[0]

    @property
    def several(self) -> bool:
        return len(self.runtimes) > 1

    @property
    def names(self) -> tuple[str, ...]:
        """Every name of every model, each model's own first."""
        return tuple(dict.fromkeys(name for r in self.runtimes for name in r.names))

    def find(self, name: str | None) -> Runtime | None:
        """The model `name` picks: the default for no name (or any name, with one model);
        None for a name no model answers to. Ollama's `:latest` tag is ignored."""
        if not name or not self.several:
            return self.default
        for wanted in (name, name.removesuffix(":latest")):
            for runtime in self.runtimes:
                if wanted in runtime.names:
                    return runtime
        return None

    @property
    def fleet_report(self) -> FleetReport | None:
        return self.fleet.report if self.fleet is not None else None

    def begin_shutdown(self) -> None:
        """Loads waiting for room give up; each residency's waiting requests end."""
        if self.fleet is not None:
            self.fleet.close()
        for runtime in self.runtimes:
            if runtime.residency is not None:
                runtime.residency.begin_shutdown()

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        for runtime in self.runtimes:
            runtime.close()
