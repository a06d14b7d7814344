"""Start-up: Settings -> the served models: resolve each model, connect RPC hosts, place it, load
it; with --idle-unload, the residency that unloads it when idle and loads it again (placed
anew). With several models (--model repeated, --models-dir): the first is loaded, the others
are checked (their header and vocabulary) and load on demand, all under one memory budget
(server.ops.fleet), each with its own settings from the config file's [models.NAME] table."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psutil
from openai_harmony import HarmonyEncoding

from server.contracts.errors import PlacementError, StartupError
from server.engine.base import Engine, EngineConfig, ModelInfo, SamplingHook
from server.engine.llama import LlamaEngine
from server.engine.loading import offload
from server.engine.loading.gguf_header import (
    GGUFFormatError,
    read_metadata,
    read_tensor_infos,
    split_paths,
    vocabulary_bytes,
)
from server.engine.loading.placement import ContextShape, Placement, PlacementOptions
from server.engine.loading.vocabulary import Vocabulary
from server.engine.rpc import backend as rpc
from server.engine.rpc.hosts import RpcError
from server.harmony import tokens
from server.harmony.encoding import load_encoding
from server.ops.fleet import ModelFleet
from server.ops.model_source import ResolvedModel, model_name, resolve_model
from server.ops.residency import ModelResidency, Unloaded
from server.ops.runtime import Runtime, ServedModels
from server.ops.settings import Settings
from server.private_files import PrivatePathError, private_dir

log = logging.getLogger(__name__)

HARMONY_SPECIALS = {t: tokens.NAMES[t] for t in (tokens.RETURN, tokens.START, tokens.CALL)}


def engine_config(settings: Settings, model_path: Path) -> EngineConfig:
    return EngineConfig(
        model_path=str(model_path),
        n_ctx=settings.n_ctx,
        n_slots=settings.n_slots,
        prefill_chunk=settings.prefill_chunk,
        max_waiting=settings.max_waiting,
        n_batch=settings.n_batch,
        n_ubatch=settings.n_ubatch,
        n_threads=settings.n_threads,
        n_threads_batch=settings.n_threads_batch,
        use_mmap=settings.use_mmap,
        flash_attn=settings.flash_attn,
        swa_full=settings.swa_full,
        speculative=settings.speculative,
        draft_max=settings.draft_max,
        backend_sampling=settings.backend_sampling,
        batch_invariant=settings.batch_invariant,
        prompt_cache_dir=str(settings.prompt_cache_dir) if settings.prompt_cache else None,
        prompt_cache_bytes=int(settings.prompt_cache_gb * 1024**3),
        prompt_cache_min_tokens=settings.prompt_cache_min_tokens,
        rpc_servers=settings.rpc,
    )


def connect_rpc_hosts(settings: Settings) -> rpc.RpcHosts | None:
    """Check the --rpc hosts and register their devices, where llama.cpp and placement see
    them; None without --rpc."""
    if not settings.rpc:
        return None
    hosts = rpc.RpcHosts(settings.rpc, settings.rpc_timeout_s, not settings.rpc_trust_network)
    try:
        devices = hosts.connect()
    except RpcError as exc:
        raise StartupError(str(exc)) from exc
    for device in devices:
        log.info("RPC host %s: device %s", device.endpoint, device.name)
    return hosts


def reconnect_after_failure(hosts: rpc.RpcHosts | None, residency: ModelResidency) -> None:
    """Before a load: the RPC hosts connected anew when the model's last engine failed while
    loaded (its connections are stuck for good); RpcError, which fails the load, while a host
    is still gone."""
    if hosts is None or not residency.failed_last:
        return
    for device in hosts.reconnect():
        log.info("RPC host %s: connected again, device %s", device.endpoint, device.name)


GIB = 1024**3
SYSTEM_MARGIN_BYTES = GIB  # system memory the automatic budget leaves free without a GPU


def load_models(settings: Settings, sampling_hook: SamplingHook | None = None) -> ServedModels:
    """Every model the settings name: one as a single-model server always served it (any
    name accepted); several under one memory budget."""
    specs = model_specs(settings)
    if len(specs) == 1:
        own = settings.for_model(settings.model_options(specs[0]))
        one = own.model_copy(update={"model": (specs[0],)})
        return ServedModels((load_runtime(one, sampling_hook),))
    models = [(spec, resolve_model(spec, settings.download_dir)) for spec in specs]
    encoding = load_encoding(
        settings.cache_dir / "vocab", lambda: vocabulary_bytes(models[0][1].path)
    )
    hosts = connect_rpc_hosts(settings)
    fleet = ModelFleet(memory_budget(settings), settings.models_max)
    log.info(
        "%d models, loaded on demand within %.1f GiB%s",
        len(models),
        fleet.budget_bytes / GIB,
        f", at most {settings.models_max} at once" if settings.models_max else "",
    )
    runtimes: list[Runtime] = []
    try:
        for index, (spec, model) in enumerate(models):
            own = model_settings(settings, spec, model, first=index == 0)
            runtime = served_runtime(
                own, model, encoding, fleet, load_now=index == 0, sampling_hook=sampling_hook,
                hosts=hosts,
            )  # fmt: skip
            runtimes.append(runtime)
    except BaseException:
        for runtime in runtimes:
            runtime.close()
        raise
    return ServedModels(tuple(distinct_names(runtimes)), fleet)


def model_specs(settings: Settings) -> list[str]:
    """The --model values (unless only --models-dir was given), then the directory's models."""
    given = "model" in settings.model_fields_set or settings.models_dir is None
    specs = list(settings.model) if given else []
    if settings.models_dir is not None:
        specs += [str(path) for path in directory_models(settings.models_dir)]
    if not specs:
        raise StartupError(f"--models-dir {settings.models_dir}: no .gguf file in it")
    return list(dict.fromkeys(specs))


def directory_models(directory: Path) -> list[Path]:
    """The GGUF files of a directory, a split model by its first part only."""
    if not directory.is_dir():
        raise StartupError(f"--models-dir {directory} is not a directory")
    files = sorted(p for p in directory.iterdir() if p.suffix == ".gguf" and p.is_file())
    return [p for p in files if split_paths(p)[0] == p]


def model_settings(settings: Settings, spec: str, model: ResolvedModel, *, first: bool) -> Settings:
    """The settings one model is served with: the server's, its [models.NAME] table over them;
    --served-model-name and --model-aliases name the first model only."""
    options = settings.model_options(spec, model.name, model_name(spec))
    own = settings.for_model(options)
    if first:
        return own
    named = options.model_fields_set if options is not None else set()
    return own.model_copy(
        update={
            "served_model_name": own.served_model_name if "served_model_name" in named else None,
            "model_aliases": own.model_aliases if "model_aliases" in named else None,
        }
    )


def served_runtime(
    settings: Settings,
    model: ResolvedModel,
    encoding: HarmonyEncoding,
    fleet: ModelFleet,
    *,
    load_now: bool,
    sampling_hook: SamplingHook | None,
    hosts: rpc.RpcHosts | None = None,
) -> Runtime:
    """One of several models: its residency in the fleet, loaded now (the first) or checked
    (header, vocabulary) and loaded when a request names it."""
    config = engine_config(settings, model.path)
    check_prompt_cache_dir(config)
    name = settings.served_model_name or model.name
    cost = memory_estimate(config)
    try:
        vocabulary = Vocabulary(str(model.path))
    except RuntimeError as exc:
        raise StartupError(str(exc)) from exc
    check_vocabulary(vocabulary.token_text, vocabulary.n_vocab, encoding)
    engine: Engine | None = None
    placement: Placement | None = None
    if load_now:
        engine, placement = load_engine(settings, config, sampling_hook)
        info = engine.info
    else:
        info = header_info(config, vocabulary.n_vocab)
    unloaded = Unloaded(info, settings.n_slots, settings.max_waiting, settings.prompt_cache)

    def reload() -> Engine:
        """Placed anew (by the memory free now), on RPC hosts connected anew after a failure."""
        reconnect_after_failure(hosts, residency)
        engine, runtime.placement = load_engine(
            settings, config, sampling_hook, abort=lambda: residency.closing
        )
        return engine

    residency = ModelResidency(
        engine, reload, vocabulary, settings.idle_unload, unloaded=unloaded, gate=fleet, name=name
    )
    fleet.add(residency, cost, loaded=load_now)
    log.info("%s: %s, ≈%.2f GiB at its context%s", name, model.path, cost / GIB,
             "" if load_now else " (loaded on demand)")  # fmt: skip
    aliases = model_aliases(settings, info.n_params)
    runtime = Runtime(residency, encoding, name, placement, aliases, residency)
    return runtime


def distinct_names(runtimes: list[Runtime]) -> list[Runtime]:
    """Each name picks one model: two models of one id are refused; an alias another model
    has (two files of one size) stays with the first that has it."""
    taken: dict[str, str] = {}
    for runtime in runtimes:
        if runtime.model_name in taken:
            raise StartupError(
                f"two models are named {runtime.model_name!r}: give one another id with "
                "served_model_name in its [models.NAME] table of the config file"
            )
        taken[runtime.model_name] = runtime.model_name
    for runtime in runtimes:
        kept = []
        for alias in runtime.aliases:
            owner = taken.setdefault(alias, runtime.model_name)
            if owner == runtime.model_name:
                kept.append(alias)
            else:
                log.warning("%s: the name %r is %s's already", runtime.model_name, alias, owner)
        runtime.aliases = tuple(kept)
    return runtimes


def memory_budget(settings: Settings) -> int:
    """--models-memory-gb, else the GPUs' free memory less the margin (the placement's
    measure), else the system memory available less SYSTEM_MARGIN_BYTES."""
    if settings.models_memory_gb is not None:
        return int(settings.models_memory_gb * GIB)
    gpus = offload.gpu_devices()
    margin = settings.gpu_margin_mb * 1024**2
    if gpus:
        return sum(max(0, gpu.free - margin) for gpu in gpus)
    return max(0, psutil.virtual_memory().available - SYSTEM_MARGIN_BYTES)


def memory_estimate(config: EngineConfig) -> int:
    """What the model takes loaded, by the placement's estimate from its GGUF header: weights,
    KV cache and compute buffer at its context."""
    context = ContextShape(config.n_ctx, config.n_ubatch, config.n_slots, config.swa_full,
                           config.flash_attn != "off")  # fmt: skip
    try:
        footprint = offload.model_footprint(Path(config.model_path), context)
    except (OSError, GGUFFormatError) as exc:
        raise PlacementError(f"cannot measure {config.model_path}: {exc}") from exc
    return footprint.total + footprint.compute


def header_info(config: EngineConfig, n_vocab: int) -> ModelInfo:
    """A model's facts from its GGUF header, until its first load tells llama.cpp's."""
    path = Path(config.model_path)
    tensors = [t for part in split_paths(path) for t in read_tensor_infos(part)]
    meta = read_metadata(path, ["general.size_label", "gpt-oss.context_length"])
    n_ctx_train = int(meta.get("gpt-oss.context_length", 0))
    size_label = str(meta.get("general.size_label", ""))
    return ModelInfo(
        path=str(path),
        description=f"gpt-oss {size_label}".strip(),
        n_ctx=config.n_ctx or n_ctx_train,
        n_ctx_train=n_ctx_train,
        n_vocab=n_vocab,
        n_params=sum(math.prod(t.shape) for t in tensors),
        size_bytes=sum(t.n_bytes for t in tensors),
    )


def load_runtime(settings: Settings, sampling_hook: SamplingHook | None = None) -> Runtime:
    """Resolve (and download) the model, load the vocabulary and the engine."""
    model = resolve_model(settings.model[0], settings.download_dir)
    encoding = load_encoding(settings.cache_dir / "vocab", lambda: vocabulary_bytes(model.path))
    config = engine_config(settings, model.path)
    check_prompt_cache_dir(config)
    hosts = connect_rpc_hosts(settings)
    engine, placement = load_engine(settings, config, sampling_hook)
    check_token_ids(engine, encoding)
    name = settings.served_model_name or model.name
    aliases = model_aliases(settings, engine.info.n_params)
    if settings.idle_unload is None and hosts is None:
        return Runtime(engine, encoding, name, placement, aliases)

    def reload() -> Engine:
        """Placed anew (by the memory free now), on RPC hosts connected anew after a failure;
        the banner's placement follows."""
        reconnect_after_failure(hosts, residency)
        engine, runtime.placement = load_engine(
            settings, config, sampling_hook, abort=lambda: residency.closing
        )
        return engine

    residency = idle_unloading(settings, engine, reload)
    runtime = Runtime(residency, encoding, name, placement, aliases, residency)
    return runtime


def idle_unloading(
    settings: Settings, engine: Engine, open_engine: Callable[[], Engine]
) -> ModelResidency:
    """The residency of a loaded engine: unloaded after --idle-unload (or only when it fails:
    with RPC hosts, one may drop), opened again on demand."""
    try:
        vocabulary = Vocabulary(engine.info.path)
    except RuntimeError as exc:
        engine.close()
        raise StartupError(str(exc)) from exc
    if settings.idle_unload is not None:
        log.info(
            "--idle-unload: the model is unloaded after %g s without a request",
            settings.idle_unload,
        )
    return ModelResidency(engine, open_engine, vocabulary, settings.idle_unload)


BIG_MODEL_PARAMS = 60e9  # between gpt-oss-20b's 20.9B and gpt-oss-120b's 116.8B


def model_aliases(settings: Settings, n_params: int) -> tuple[str, ...]:
    """The names the model also answers to: --model-aliases, else the names Codex's --oss asks
    Ollama and LM Studio for (gpt-oss:20b, openai/gpt-oss-20b), for the model's size."""
    if settings.model_aliases is not None:
        return settings.model_aliases
    size = "120b" if n_params >= BIG_MODEL_PARAMS else "20b"
    return (f"gpt-oss:{size}", f"openai/gpt-oss-{size}")


def start_engine(
    settings: Settings, config: EngineConfig, sampling_hook: SamplingHook | None = None
) -> tuple[LlamaEngine, Placement]:
    """Connect the --rpc hosts, place the model on the devices and load it (StartupError when
    it cannot)."""
    check_prompt_cache_dir(config)
    connect_rpc_hosts(settings)
    return load_engine(settings, config, sampling_hook)


def load_engine(
    settings: Settings,
    config: EngineConfig,
    sampling_hook: SamplingHook | None = None,
    abort: Callable[[], bool] | None = None,
) -> tuple[LlamaEngine, Placement]:
    """Place the model on the devices (their free memory now) and load it (StartupError when
    it cannot, or once `abort()` is true while it loads); the RPC hosts are connected
    already."""
    placement = place_model(config, settings)
    config = replace(
        config,
        n_gpu_layers=placement.n_gpu_layers,
        cpu_tensor_patterns=placement.cpu_patterns,
        tensor_split=placement.tensor_split,
    )
    log.info("loading %s", config.model_path)
    try:
        engine = LlamaEngine(config, sampling_hook, abort)
    except (RuntimeError, RpcError) as exc:  # RpcError: a host dropped while loading
        raise StartupError(f"could not load {config.model_path}: {exc}") from exc
    except PrivatePathError as exc:  # changed since the check
        raise StartupError(f"--prompt-cache-dir: {exc}") from exc
    return engine, placement


def check_prompt_cache_dir(config: EngineConfig) -> None:
    """The prompt cache's directory, created 0700 or refused (before minutes of loading) when
    another user owns it or may write into it."""
    if config.prompt_cache_dir is None:
        return
    try:
        private_dir(Path(config.prompt_cache_dir))
    except PrivatePathError as exc:
        raise StartupError(f"--prompt-cache-dir: {exc}") from exc


def placement_options(settings: Settings) -> PlacementOptions:
    """What the settings ask of the placement."""
    return PlacementOptions(
        n_gpu_layers=-1 if settings.n_gpu_layers == "all" else settings.n_gpu_layers,
        cpu_moe=settings.cpu_moe,
        n_cpu_moe=settings.n_cpu_moe,
        margin=settings.gpu_margin_mb * 1024**2,
    )


def place_model(config: EngineConfig, settings: Settings) -> Placement:
    """Decide what goes on the GPU (server.engine.loading.placement) and log the plan."""
    try:
        placement = offload.plan(config, placement_options(settings))
    except (OSError, GGUFFormatError) as exc:
        raise PlacementError(f"cannot measure {config.model_path} to place it: {exc}") from exc
    for line in placement.lines:
        log.log(logging.INFO if placement.fits else logging.WARNING, "%s", line)
    return placement


def check_token_ids(engine: Engine, encoding: HarmonyEncoding) -> None:
    """The model's vocabulary must give harmony's special tokens harmony's ids."""
    check_vocabulary(engine.token_text, engine.info.n_vocab, encoding)


def check_vocabulary(
    token_text: Callable[[int], str], n_vocab: int, encoding: HarmonyEncoding
) -> None:
    """check_token_ids() on a vocabulary alone."""
    for token_id, text in HARMONY_SPECIALS.items():
        in_model = token_text(token_id) if token_id < n_vocab else None
        in_harmony = encoding.decode_utf8([token_id])
        if in_model != text or in_harmony != text:
            raise StartupError(
                f"token {token_id} is {in_model!r} in the model and {in_harmony!r} in harmony, "
                f"expected {text!r}: the file is not a gpt-oss (o200k_harmony) model"
            )
