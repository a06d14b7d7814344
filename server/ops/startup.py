"""Start-up: Settings -> a Runtime: resolve the model, connect RPC hosts, place it, load it;
with --idle-unload, the residency that unloads it when idle and loads it again (placed anew)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from openai_harmony import HarmonyEncoding

from server.contracts.errors import PlacementError, StartupError
from server.engine.base import Engine, EngineConfig, SamplingHook
from server.engine.llama import LlamaEngine
from server.engine.loading import offload
from server.engine.loading.gguf_header import GGUFFormatError, vocabulary_bytes
from server.engine.loading.placement import Placement, PlacementOptions
from server.engine.loading.vocabulary import Vocabulary
from server.engine.rpc import backend as rpc
from server.engine.rpc.hosts import RpcError
from server.harmony import tokens
from server.harmony.encoding import load_encoding
from server.ops.model_source import resolve_model
from server.ops.residency import ModelResidency
from server.ops.runtime import Runtime
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
        batch_invariant=settings.batch_invariant,
        prompt_cache_dir=str(settings.prompt_cache_dir) if settings.prompt_cache else None,
        prompt_cache_bytes=int(settings.prompt_cache_gb * 1024**3),
        prompt_cache_min_tokens=settings.prompt_cache_min_tokens,
        rpc_servers=settings.rpc,
    )


def connect_rpc_hosts(settings: Settings) -> None:
    """Check the --rpc hosts and register their devices, where llama.cpp and placement see them."""
    if not settings.rpc:
        return
    try:
        devices = rpc.connect(settings.rpc, settings.rpc_timeout_s, not settings.rpc_trust_network)
    except RpcError as exc:
        raise StartupError(str(exc)) from exc
    for device in devices:
        log.info("RPC host %s: device %s", device.endpoint, device.name)


def load_runtime(settings: Settings, sampling_hook: SamplingHook | None = None) -> Runtime:
    """Resolve (and download) the model, load the vocabulary and the engine."""
    model = resolve_model(settings.model, settings.download_dir)
    encoding = load_encoding(settings.cache_dir / "vocab", lambda: vocabulary_bytes(model.path))
    config = engine_config(settings, model.path)
    engine, placement = start_engine(settings, config, sampling_hook)
    check_token_ids(engine, encoding)
    name = settings.served_model_name or model.name
    aliases = model_aliases(settings, engine.info.n_params)
    if settings.idle_unload is None:
        return Runtime(engine, encoding, name, placement, aliases)

    def reload() -> Engine:
        """Placed anew (by the memory free now); the banner's placement follows."""
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
    """The residency of a loaded engine: unloaded after --idle-unload, opened again on demand."""
    assert settings.idle_unload is not None
    try:
        vocabulary = Vocabulary(engine.info.path)
    except RuntimeError as exc:
        engine.close()
        raise StartupError(str(exc)) from exc
    log.info(
        "--idle-unload: the model is unloaded after %g s without a request", settings.idle_unload
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
    for token_id, text in HARMONY_SPECIALS.items():
        in_model = engine.token_text(token_id) if token_id < engine.info.n_vocab else None
        in_harmony = encoding.decode_utf8([token_id])
        if in_model != text or in_harmony != text:
            raise StartupError(
                f"token {token_id} is {in_model!r} in the model and {in_harmony!r} in harmony, "
                f"expected {text!r}: the file is not a gpt-oss (o200k_harmony) model"
            )
