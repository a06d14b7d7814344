"""Resolve --model to a local, validated gpt-oss GGUF file, downloading it when needed.

Accepted forms: a catalog alias (models/catalog.json: gpt-oss-20b, gpt-oss-120b, ...), a path to
a .gguf file (for a split model such as gpt-oss-120b, any part: its first part is loaded and every
part must sit beside it), or a Hugging Face repo as `owner/name[:file]` (naming a part of a split
model fetches all its parts).
Downloads go through huggingface-hub, with its progress bars and cache; a cached file is used
without network access.

Before the Hub is asked anything, its host (HF_ENDPOINT's, or the proxy's when one applies) is
looked up and connected to (`hub_reachable`): a name that does not resolve is final at once
(no network, or a mistyped endpoint: retrying does not help), a connection that fails is tried
again briefly, each failure said once; only then does huggingface-hub, with its own retries,
get the request. Offline, `serve` thus fails in about a second with one clear error instead
of half a minute of the Hub client's retries.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from huggingface_hub import constants as hub_constants
from huggingface_hub import hf_hub_download, list_repo_files, try_to_load_from_cache
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)

from server.contracts.errors import ModelSourceError
from server.engine.loading.gguf_header import GGUFFormatError, read_metadata, split_paths

log = logging.getLogger(__name__)

ARCHITECTURE = "gpt-oss"
SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")
HF_SPEC = re.compile(r"(?P<repo>[\w-][\w.-]*/[\w.-]+)(?::(?P<file>[^:]+\.gguf))?")
CONNECT_ATTEMPTS = 3  # a refused or timed-out connection to the Hub: tried this many times
CONNECT_TIMEOUT_S = 5.0
RETRY_WAITS_S = (1.0, 2.0)  # between those attempts


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    alias: str
    repo: str
    files: tuple[str, ...]
    description: str
    context_length: int
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    path: Path  # the file to load (the first part of a split model)
    name: str  # the id reported to clients


def resolve_model(
    spec: str, download_dir: Path | None = None, *, refresh: bool = False
) -> ResolvedModel:
    """A local gpt-oss GGUF for `spec`; raises ModelSourceError saying what to do.

    Files already in the Hugging Face cache are used without network access unless `refresh`
    asks to check the Hub for a newer revision.
    """
    entry = find_catalog_entry(spec)
    if entry is not None:
        path = download(entry.repo, entry.files, download_dir, refresh=refresh, label=entry.alias)
        return ResolvedModel(check_gguf(path), entry.alias)
    local = Path(spec).expanduser()
    if local.exists():
        return ResolvedModel(check_gguf(first_part(local)), model_name(local.name))
    hf_repo = HF_SPEC.fullmatch(spec)
    if hf_repo is None or (hf_repo["file"] is None and spec.endswith(".gguf")):
        if spec.endswith(".gguf") or "/" in spec:
            return ResolvedModel(check_gguf(local), model_name(local.name))  # raises
        raise ModelSourceError(
            f"--model {spec!r} is not a catalog alias ({', '.join(catalog())}), an existing "
            "file, or a Hugging Face repo in the form owner/name[:file.gguf]."
        )
    repo, filename = hf_repo["repo"], hf_repo["file"]
    files = split_names(filename) if filename else _repo_gguf_files(repo)
    path = download(repo, files, download_dir, refresh=refresh, label=spec)
    return ResolvedModel(check_gguf(path), model_name(files[0]))


def model_name(filename: str) -> str:
    """The id clients see for a model file: its name without .gguf and split numbering."""
    return SPLIT_SUFFIX.sub("", Path(filename).stem)


def first_part(path: Path) -> Path:
    """The file llama.cpp must be given for `path`: the first part of a split model."""
    first = split_paths(path)[0]
    if first != path:
        log.info("%s is part of a split model: loading its first part %s", path.name, first.name)
    return first


def split_names(filename: str) -> tuple[str, ...]:
    """Every part of a split model's file name (in a repo), or just the name."""
    return tuple(part.as_posix() for part in split_paths(Path(filename)))


def check_gguf(path: Path) -> Path:
    """The path, if it is a readable gpt-oss GGUF file (with every part, if split)."""
    if not path.is_file():
        raise ModelSourceError(
            f"model file {path} does not exist. Pass an existing .gguf file, a catalog alias "
            f"({', '.join(catalog())}) or a Hugging Face repo owner/name[:file.gguf]."
        )
    try:
        meta = read_metadata(path, ["general.architecture"])
    except GGUFFormatError as exc:
        raise ModelSourceError(
            f"{path} is not a usable GGUF file ({exc}). Download a gpt-oss GGUF, for example "
            "with `gpt-oss-server download gpt-oss-20b`."
        ) from exc
    architecture = meta.get("general.architecture")
    if architecture != ARCHITECTURE:
        raise ModelSourceError(
            f"{path} is a GGUF of architecture {architecture!r}, not {ARCHITECTURE!r}: this "
            "server runs OpenAI's gpt-oss models only. Use a gpt-oss GGUF such as "
            "ggml-org/gpt-oss-20b-GGUF."
        )
    missing = [part.name for part in split_paths(path) if not part.is_file()]
    if missing:
        raise ModelSourceError(
            f"{path.name} is the first part of a split model, but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not in {path.parent}: every part must sit "
            "beside the first (`gpt-oss-server download gpt-oss-120b` fetches all of them)."
        )
    return path


def download(
    repo: str,
    files: tuple[str, ...],
    download_dir: Path | None,
    *,
    refresh: bool = False,
    label: str = "",
) -> Path:
    """Every file from the cache or the Hub (with progress bars); the first file's path."""
    paths = [_fetch(repo, name, download_dir, refresh, label or repo) for name in files]
    return paths[0]


class HubUnreachable(Exception):
    """The Hugging Face Hub cannot be reached from here; the message says why."""


@dataclass(frozen=True, slots=True)
class HubAddress:
    host: str
    port: int
    via_proxy: bool = False

    def __str__(self) -> str:
        return f"{'the proxy ' if self.via_proxy else ''}{self.host}:{self.port}"


def hub_address(endpoint: str | None = None) -> HubAddress:
    """Where a request to the Hub connects first: HF_ENDPOINT's host, or the proxy's that the
    environment sets for it (the proxy then resolves the Hub's name, not this machine)."""
    url = urlsplit(endpoint or hub_constants.ENDPOINT)
    scheme = url.scheme or "https"
    host = url.hostname or ""
    default_port = 443 if scheme == "https" else 80
    proxy = urllib.request.getproxies().get(scheme)
    if proxy and host and not urllib.request.proxy_bypass(host):
        proxied = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        if proxied.hostname:
            return HubAddress(proxied.hostname, proxied.port or 80, via_proxy=True)
    return HubAddress(host, url.port or default_port)


def hub_reachable(
    address: HubAddress | None = None,
    *,
    attempts: int = CONNECT_ATTEMPTS,
    waits_s: tuple[float, ...] = RETRY_WAITS_S,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Returns once a TCP connection to the Hub (or its proxy) opens; raises HubUnreachable.

    A name that does not resolve is final at once; a failed connection is tried `attempts`
    times, each failure logged once with what comes next."""
    address = address or hub_address()
    try:
        infos = socket.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise HubUnreachable(
            f"{address} does not resolve: {exc.strerror or exc} (no network, or no name "
            "server knows it)"
        ) from None
    for attempt in range(1, attempts + 1):
        try:
            _connect(infos)
            return
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            if attempt == attempts:
                raise HubUnreachable(f"{address} refuses or drops connections: {reason}") from None
            wait = waits_s[min(attempt - 1, len(waits_s) - 1)] if waits_s else 0.0
            log.warning(
                "the Hugging Face Hub at %s cannot be reached (%s); trying again in %g s "
                "(attempt %d of %d)",
                address,
                reason,
                wait,
                attempt + 1,
                attempts,
            )
            sleep(wait)


def _connect(infos: list[tuple[Any, ...]]) -> None:
    """A TCP connection to the first address that takes one, closed at once."""
    error: OSError = OSError("no address")
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(CONNECT_TIMEOUT_S)
                sock.connect(sockaddr)
                return
        except OSError as exc:
            error = exc
    raise error


def _check_hub(what: str, label: str) -> None:
    """The Hub can be reached, or a ModelSourceError saying what to do instead."""
    if hub_constants.HF_HUB_OFFLINE:
        return  # huggingface-hub itself answers from its cache, or says it is offline
    try:
        hub_reachable()
    except HubUnreachable as exc:
        raise ModelSourceError(
            f"cannot download {what}: the Hugging Face Hub cannot be reached, {exc}. The file "
            "is not in the local cache: on a machine with internet access run "
            f"`gpt-oss-server download {label}`, or pass --model /path/to/file.gguf."
        ) from None


def quiet_hub_logging() -> None:
    """huggingface-hub's messages through the root logger's handlers only: the library adds a
    handler of its own to its logger, which (propagating too) printed each message twice."""
    from huggingface_hub.utils import logging as hub_logging

    hub = hub_logging.get_logger()  # the library's root logger, its handler set up by now
    for handler in list(hub.handlers):
        hub.removeHandler(handler)


def _fetch(repo: str, filename: str, download_dir: Path | None, refresh: bool, label: str) -> Path:
    cached = try_to_load_from_cache(repo, filename, cache_dir=download_dir)
    if not refresh and isinstance(cached, str):
        return Path(cached)
    try:
        _check_hub(f"{repo}/{filename}", label)
    except ModelSourceError:
        if isinstance(cached, str):  # --refresh offline: the cached revision it is
            log.warning("the Hugging Face Hub cannot be reached: using the cached %s", filename)
            return Path(cached)
        raise
    log.info("downloading %s from %s", filename, repo)
    try:
        return Path(hf_hub_download(repo, filename, cache_dir=download_dir))
    except LocalEntryNotFoundError as exc:
        raise ModelSourceError(
            f"cannot download {repo}/{filename}: the Hugging Face Hub cannot be reached and the "
            "file is not in the local cache. On a machine with internet access run "
            f"`gpt-oss-server download {label}`, or pass --model /path/to/file.gguf."
        ) from exc
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ModelSourceError(
            f"the Hugging Face repo {repo} does not exist or needs access rights "
            "(log in with `hf auth login`)."
        ) from exc
    except EntryNotFoundError as exc:
        raise ModelSourceError(f"the Hugging Face repo {repo} has no file {filename}.") from exc
    except HfHubHTTPError as exc:
        raise ModelSourceError(f"downloading {repo}/{filename} failed: {exc}") from exc


def _repo_gguf_files(repo: str) -> tuple[str, ...]:
    _check_hub(f"the file list of {repo}", repo)
    try:
        names = list_repo_files(repo)
    except (HfHubHTTPError, OSError) as exc:
        raise ModelSourceError(
            f"cannot list the files of {repo} ({exc}); name the file: --model {repo}:FILE.gguf"
        ) from exc
    ggufs = sorted(name for name in names if name.endswith(".gguf"))
    firsts = [n for n in ggufs if "-of-" not in n or "-00001-of-" in n]
    if len(firsts) != 1:
        raise ModelSourceError(
            f"{repo} holds {len(firsts)} GGUF models ({', '.join(firsts) or 'none'}); "
            f"choose one: --model {repo}:FILE.gguf"
        )
    first = firsts[0]
    if "-00001-of-" not in first:
        return (first,)
    prefix = first.split("-00001-of-")[0]
    return tuple(n for n in ggufs if n.startswith(prefix + "-0"))


def find_catalog_entry(spec: str) -> CatalogEntry | None:
    for entry in catalog().values():
        if spec == entry.alias or spec in entry.aliases:
            return entry
    return None


@cache
def catalog() -> dict[str, CatalogEntry]:
    """The model catalog shipped with the server."""
    raw = json.loads(_catalog_text())
    return {
        alias: CatalogEntry(
            alias=alias,
            repo=item["repo"],
            files=tuple(item["files"]),
            description=item["description"],
            context_length=item["context_length"],
            aliases=tuple(item.get("aliases", ())),
        )
        for alias, item in raw.items()
    }


def _catalog_text() -> str:
    packaged = resources.files("server").joinpath("catalog.json")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = Path(__file__).resolve().parents[2] / "models" / "catalog.json"
    return checkout.read_text(encoding="utf-8")
