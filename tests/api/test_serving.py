"""The start-up banner and the URL clients are told to use."""

from __future__ import annotations

from dataclasses import replace

from server.engine.loading.placement import Placement
from server.ops.healthcheck import client_url
from server.ops.runtime import Runtime
from server.ops.serving import banner, exposure_warning
from server.ops.settings import Settings


def test_client_url_for_each_kind_of_bind_address() -> None:
    assert client_url("0.0.0.0", 8000) == "http://127.0.0.1:8000/v1"
    assert client_url("::", 8001) == "http://127.0.0.1:8001/v1"
    assert client_url("192.168.1.5", 80) == "http://192.168.1.5:80/v1"
    assert client_url("::1", 8000) == "http://[::1]:8000/v1"


def test_banner_names_model_placement_url_and_snippets(runtime: Runtime) -> None:
    placement = Placement(
        n_gpu_layers=-1,
        n_cpu_moe=6,
        cpu_patterns=(),
        gpu_bytes=1,
        cpu_bytes=1,
        budget=2,
        summary="GPU: 24/24 layers; MoE experts of layers 0-5 on the CPU",
        lines=(),
    )
    settings = Settings(host="0.0.0.0", port=8123, api_key="secret-key")
    text = banner(settings, replace(runtime, placement=placement))
    assert f"model      {runtime.model_name}: " in text
    assert f"file       {runtime.engine.info.path}" in text
    assert f"context    {runtime.engine.info.n_ctx} tokens" in text
    assert "placement  GPU: 24/24 layers; MoE experts of layers 0-5 on the CPU" in text
    assert "API        http://127.0.0.1:8123/v1 (all interfaces)" in text
    assert "chat page  http://127.0.0.1:8123/ (in a browser)" in text
    assert "Authorization: Bearer $GPT_OSS_API_KEY" in text
    assert 'api_key=os.environ["GPT_OSS_API_KEY"]' in text
    assert "secret-key" not in text
    curl = next(line for line in text.splitlines() if line.startswith("curl "))
    assert f'"model": "{runtime.model_name}"' in curl


def test_binding_beyond_loopback_without_a_key_is_warned_about() -> None:
    assert Settings().host == "127.0.0.1"  # the default binds loopback only
    for host in ("127.0.0.1", "127.0.1.1", "localhost", "::1", "[::1]"):
        assert exposure_warning(host, has_api_key=False) is None, host
    for host in ("0.0.0.0", "::", "", "192.168.1.5", "myhost.lan"):
        assert exposure_warning(host, has_api_key=True) is None, host
        warning = exposure_warning(host, has_api_key=False)
        assert warning is not None, host
        assert "WITHOUT an API key" in warning
        assert "--api-key" in warning
    assert "all interfaces" in (exposure_warning("0.0.0.0", has_api_key=False) or "")
