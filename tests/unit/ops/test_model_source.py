"""Model resolution: catalog aliases, paths, Hugging Face repos, and the errors users see."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import gguf
import huggingface_hub.constants
import pytest

from devkit.serving import free_port
from server.cli import main
from server.contracts.errors import ModelSourceError
from server.engine.loading.gguf_header import (
    read_metadata,
    read_tensor_infos,
    split_paths,
    vocabulary_bytes,
)
from server.engine.loading.gpt_oss import tensor_specs
from server.ops import model_source
from server.ops.model_source import (
    HubAddress,
    HubUnreachable,
    catalog,
    check_gguf,
    find_catalog_entry,
    hub_reachable,
    model_name,
    resolve_model,
)
from server.synth.build import PRESETS

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fill_hf_cache(cache: Path, repo: str, files: dict[str, Path]) -> None:
    """Lay files out the way huggingface-hub's cache stores a downloaded snapshot."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for name, source in files.items():
        (snapshot / name).symlink_to(source)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


def test_catalog_has_both_models_with_split_files() -> None:
    models = catalog()
    assert models["gpt-oss-20b"].repo == "ggml-org/gpt-oss-20b-GGUF"
    assert models["gpt-oss-20b"].files == ("gpt-oss-20b-mxfp4.gguf",)
    parts = models["gpt-oss-120b"].files
    assert len(parts) == 3
    assert all(f"-0000{i}-of-00003.gguf" in p for i, p in enumerate(parts, 1))
    entry = find_catalog_entry("openai/gpt-oss-20b")
    assert entry is not None
    assert entry.alias == "gpt-oss-20b"


def test_local_gpt_oss_file(tiny_gguf: Path) -> None:
    model = resolve_model(str(tiny_gguf))
    assert model.path == tiny_gguf
    assert model.name == tiny_gguf.stem


def test_model_names_drop_split_numbering() -> None:
    assert model_name("gpt-oss-120b-mxfp4-00001-of-00003.gguf") == "gpt-oss-120b-mxfp4"
    assert model_name("gpt-oss-20b-mxfp4.gguf") == "gpt-oss-20b-mxfp4"


def test_missing_file_says_what_to_pass(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match=r"does not exist.*catalog alias"):
        resolve_model(str(tmp_path / "missing.gguf"))


def test_not_a_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "weights.gguf"
    bogus.write_text("definitely not gguf")
    with pytest.raises(ModelSourceError, match="not a usable GGUF file"):
        check_gguf(bogus)


def test_other_architecture_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "llama.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelSourceError, match="architecture 'llama', not 'gpt-oss'"):
        check_gguf(path)


def test_unrecognised_spec(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="not a catalog alias"):
        resolve_model("just-a-word")


def test_alias_resolves_from_the_hf_cache_offline(
    tiny_gguf: Path, tmp_path: Path, offline: None
) -> None:
    fill_hf_cache(tmp_path, "ggml-org/gpt-oss-20b-GGUF", {"gpt-oss-20b-mxfp4.gguf": tiny_gguf})
    model = resolve_model("gpt-oss-20b", download_dir=tmp_path)
    assert model.name == "gpt-oss-20b"
    assert model.path.resolve() == tiny_gguf.resolve()
    assert model.path.parent.name == COMMIT


def test_split_model_needs_every_part(tiny_gguf: Path, tmp_path: Path, offline: None) -> None:
    parts = catalog()["gpt-oss-120b"].files
    fill_hf_cache(tmp_path, "ggml-org/gpt-oss-120b-GGUF", {parts[0]: tiny_gguf})
    with pytest.raises(ModelSourceError, match=f"cannot download .*{parts[1]}"):
        resolve_model("gpt-oss-120b", download_dir=tmp_path)


def test_repo_with_file_from_the_cache(tiny_gguf: Path, tmp_path: Path, offline: None) -> None:
    fill_hf_cache(tmp_path, "someone/my-gpt-oss", {"tuned.gguf": tiny_gguf})
    model = resolve_model("someone/my-gpt-oss:tuned.gguf", download_dir=tmp_path)
    assert model.name == "tuned"


def test_offline_without_cache_says_what_to_do(tmp_path: Path, offline: None) -> None:
    with pytest.raises(ModelSourceError) as raised:
        resolve_model("gpt-oss-20b", download_dir=tmp_path)
    message = str(raised.value)
    assert "cannot be reached" in message
    assert "gpt-oss-server download gpt-oss-20b" in message
    assert "--model /path/to/file.gguf" in message


def test_metadata_reader_agrees_with_the_file(tiny_gguf: Path) -> None:
    meta = read_metadata(tiny_gguf, ["general.architecture", "gpt-oss.context_length", "nope"])
    assert meta == {"general.architecture": "gpt-oss", "gpt-oss.context_length": 131072}
    ranks = vocabulary_bytes(tiny_gguf)
    assert len(ranks) == 201088
    assert ranks[0] == b"!"
    assert ranks[200006] == b"<|start|>"


# ----------------------------------------------------------------------------- split models

REPO_120B = "ggml-org/gpt-oss-120b-GGUF"


def parts_120b() -> tuple[str, ...]:
    return catalog()["gpt-oss-120b"].files


def split_copy(directory: Path, tiny_gguf: Path, present: tuple[int, ...] = (1, 2, 3)) -> Path:
    """The parts of a local split model (the tiny GGUF stands in for each); the first part."""
    directory.mkdir(parents=True, exist_ok=True)
    for index in present:
        (directory / parts_120b()[index - 1]).symlink_to(tiny_gguf)
    return directory / parts_120b()[0]


def test_120b_resolves_to_its_first_part_when_all_parts_are_cached(
    tiny_gguf: Path, tmp_path: Path, offline: None
) -> None:
    fill_hf_cache(tmp_path, REPO_120B, dict.fromkeys(parts_120b(), tiny_gguf))
    model = resolve_model("gpt-oss-120b", download_dir=tmp_path)
    assert model.name == "gpt-oss-120b"
    assert model.path.name == "gpt-oss-120b-mxfp4-00001-of-00003.gguf"
    assert model.path.parent.name == COMMIT
    assert all((model.path.parent / part).is_file() for part in parts_120b())


def test_download_goes_through_huggingface_hub_offline(
    tiny_gguf: Path, tmp_path: Path, offline: None
) -> None:
    """refresh (the download command) asks huggingface-hub, which answers from its cache."""
    fill_hf_cache(tmp_path, REPO_120B, dict.fromkeys(parts_120b(), tiny_gguf))
    model = resolve_model("120b", download_dir=tmp_path, refresh=True)
    assert model.path.name == parts_120b()[0]


def test_download_fetches_every_part_with_huggingface_hub(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched: list[tuple[str, str, Path | None]] = []

    def fake_download(repo: str, filename: str, cache_dir: Path | None = None) -> str:
        fetched.append((repo, filename, cache_dir))
        target = tmp_path / "snapshot" / filename
        target.parent.mkdir(exist_ok=True)
        target.symlink_to(tiny_gguf)
        return str(target)

    monkeypatch.setattr(model_source, "hf_hub_download", fake_download)
    monkeypatch.setattr(model_source, "hub_reachable", lambda: None)  # as if online
    main(["download", "gpt-oss-120b", "--download-dir", str(tmp_path)])
    assert fetched == [(REPO_120B, part, tmp_path) for part in parts_120b()]


def test_download_command_reports_the_ready_file(
    tiny_gguf: Path, tmp_path: Path, offline: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fill_hf_cache(tmp_path, REPO_120B, dict.fromkeys(parts_120b(), tiny_gguf))
    main(["download", "gpt-oss-120b", "--download-dir", str(tmp_path)])
    assert f"gpt-oss-120b is ready at {tmp_path}" in caplog.text
    assert parts_120b()[0] in caplog.text


def test_repo_file_naming_a_split_part_fetches_every_part(
    tiny_gguf: Path, tmp_path: Path, offline: None
) -> None:
    spec = f"{REPO_120B}:{parts_120b()[0]}"
    fill_hf_cache(tmp_path, REPO_120B, {parts_120b()[0]: tiny_gguf})
    with pytest.raises(ModelSourceError, match=f"cannot download .*{parts_120b()[1]}"):
        resolve_model(spec, download_dir=tmp_path)
    for part in parts_120b()[1:]:
        snapshot = tmp_path / f"models--{REPO_120B.replace('/', '--')}" / "snapshots" / COMMIT
        (snapshot / part).symlink_to(tiny_gguf)
    model = resolve_model(spec, download_dir=tmp_path)
    assert (model.path.name, model.name) == (parts_120b()[0], "gpt-oss-120b-mxfp4")


def test_local_split_model_by_its_first_part(tiny_gguf: Path, tmp_path: Path) -> None:
    first = split_copy(tmp_path / "models", tiny_gguf)
    model = resolve_model(str(first))
    assert (model.path, model.name) == (first, "gpt-oss-120b-mxfp4")


def test_local_split_model_by_another_part_loads_the_first(tiny_gguf: Path, tmp_path: Path) -> None:
    first = split_copy(tmp_path, tiny_gguf)
    assert resolve_model(str(tmp_path / parts_120b()[2])).path == first


def test_local_split_model_with_a_missing_part(tiny_gguf: Path, tmp_path: Path) -> None:
    first = split_copy(tmp_path, tiny_gguf, present=(1, 2))
    with pytest.raises(ModelSourceError, match=f"{parts_120b()[2]} is not in {tmp_path}"):
        resolve_model(str(first))


def test_split_paths() -> None:
    assert split_paths(Path("/m/x-00002-of-00003.gguf")) == [
        Path("/m/x-00001-of-00003.gguf"),
        Path("/m/x-00002-of-00003.gguf"),
        Path("/m/x-00003-of-00003.gguf"),
    ]
    assert split_paths(Path("/m/gpt-oss-20b-mxfp4.gguf")) == [Path("/m/gpt-oss-20b-mxfp4.gguf")]


def test_tensor_infos_agree_with_the_builder(tiny_gguf: Path) -> None:
    infos = read_tensor_infos(tiny_gguf)
    specs = tensor_specs(PRESETS["tiny"])
    assert [(i.name, i.shape) for i in infos] == [(s.name, s.shape) for s in specs]
    assert all(0 <= i.n_bytes - s.nbytes < 32 for i, s in zip(infos, specs, strict=True))


def no_wait(seconds: float) -> None:
    pytest.fail(f"a wait of {seconds} s: the first connection should have been taken")


def test_the_hub_reachable_on_a_listening_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        hub_reachable(HubAddress("127.0.0.1", port), sleep=no_wait)


def test_a_closed_port_is_tried_again_then_final(caplog: pytest.LogCaptureFixture) -> None:
    waits: list[float] = []
    address = HubAddress("127.0.0.1", free_port())
    with pytest.raises(HubUnreachable, match="refuses or drops connections"):
        hub_reachable(address, attempts=3, waits_s=(1.0, 2.0), sleep=waits.append)
    assert waits == [1.0, 2.0]
    retries = [r.getMessage() for r in caplog.records if "trying again" in r.getMessage()]
    assert [m.rsplit("(", 1)[-1] for m in retries] == ["attempt 2 of 3)", "attempt 3 of 3)"]


def test_a_name_that_does_not_resolve_is_final_at_once() -> None:
    waits: list[float] = []
    with pytest.raises(HubUnreachable, match=r"hub\.invalid:443 does not resolve"):
        hub_reachable(HubAddress("hub.invalid", 443), sleep=waits.append)
    assert waits == []


def test_refresh_offline_uses_the_cached_file(
    tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fill_hf_cache(tmp_path, REPO_120B, dict.fromkeys(parts_120b(), tiny_gguf))
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "https://hub.invalid")
    model = resolve_model("120b", download_dir=tmp_path, refresh=True)
    assert model.path.name == parts_120b()[0]
