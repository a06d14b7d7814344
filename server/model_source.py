"""Resolve --model to a local, validated gpt-oss GGUF file, downloading it when needed.

Accepted forms: a catalog alias (models/catalog.json: gpt-oss-20b, gpt-oss-120b, ...), a path to
a .gguf file (the first part of a split model), or a Hugging Face repo as `owner/name[:file]`.
Downloads go through huggingface-hub, with its progress bars and cache; a cached file is used
without network access.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from huggingface_hub import hf_hub_download, list_repo_files
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)

from server.errors import ModelSourceError
from server.gguf_meta import GGUFFormatError, read_metadata

log = logging.getLogger(__name__)

ARCHITECTURE = "gpt-oss"


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


def resolve_model(spec: str, download_dir: Path | None = None) -> ResolvedModel:
    """A local gpt-oss GGUF for `spec`; raises ModelSourceError saying what to do."""
    entry = find_catalog_entry(spec)
    if entry is not None:
        path = download(entry.repo, entry.files, download_dir)
        return ResolvedModel(check_gguf(path), entry.alias)
    local = Path(spec).expanduser()
    if local.exists() or _looks_like_path(spec):
        return ResolvedModel(check_gguf(local), local.stem)
    repo, _, filename = spec.partition(":")
    if repo.count("/") != 1:
        raise ModelSourceError(
            f"--model {spec!r} is not a catalog alias ({', '.join(catalog())}), an existing file, "
            "or a Hugging Face repo in the form owner/name[:file.gguf]."
        )
    files = (filename,) if filename else _repo_gguf_files(repo)
    path = download(repo, files, download_dir)
    return ResolvedModel(check_gguf(path), Path(files[0]).stem)


def check_gguf(path: Path) -> Path:
    """The path, if it is a readable gpt-oss GGUF file."""
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
    return path


def download(repo: str, files: tuple[str, ...], download_dir: Path | None) -> Path:
    """Fetch every file (or find it in the cache); returns the first file's local path."""
    paths = [_download_one(repo, name, download_dir) for name in files]
    return paths[0]


def _download_one(repo: str, filename: str, download_dir: Path | None) -> Path:
    try:
        return Path(hf_hub_download(repo, filename, cache_dir=download_dir))
    except LocalEntryNotFoundError as exc:
        raise ModelSourceError(
            f"cannot download {repo}/{filename}: the Hugging Face Hub cannot be reached and the "
            "file is not in the local cache. Connect to the internet and run "
            f"`gpt-oss-server download {repo}:{filename}`, or pass --model /path/to/file.gguf."
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


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".gguf") or spec.startswith((".", "/", "~"))


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
    checkout = Path(__file__).resolve().parent.parent / "models" / "catalog.json"
    return checkout.read_text(encoding="utf-8")
