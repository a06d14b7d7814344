"""lm-evaluation-harness (PyPI `lm-eval`) as the real client, offline, on the tiny model.

A small local task (tests/data/lm_eval: YAML over a JSON file, no hub download) runs through
lm-eval's `local-completions` model (loglikelihood: /v1/completions with echo + logprobs,
token-id prompts from tiktoken's o200k_harmony, the encoding gpt-oss uses) and its
`local-chat-completions` model (generation: /v1/chat/completions). Each loglikelihood lm-eval
reports must equal the engine's own prompt scoring of the same tokens.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from devkit.forced import ForcedScript
from server.engine.base import SamplingParams
from server.engine.llama import LlamaEngine
from server.harmony.encoding import VOCAB_FILE, ensure_vocab_dir

pytestmark = pytest.mark.slow  # lm-eval's import and task set-up take a while

TASKS = Path(__file__).parents[1] / "data" / "lm_eval"
VOCAB_URL = f"https://openaipublic.blob.core.windows.net/encodings/{VOCAB_FILE}"


@pytest.fixture
def offline(tmp_path: Path, vocab_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: datasets and the hub offline, tiktoken's cache holding the local vocabulary
    (under the name tiktoken gives its download)."""
    cache = tmp_path / "tiktoken"
    cache.mkdir()
    source = ensure_vocab_dir(vocab_dir) / VOCAB_FILE
    shutil.copy(source, cache / hashlib.sha1(VOCAB_URL.encode()).hexdigest())
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))


def task(name: str) -> dict[str, Any]:
    """A task of tests/data/lm_eval, its data file named by its absolute path."""
    config: dict[str, Any] = yaml.safe_load((TASKS / f"{name}.yaml").read_text())
    files = config["dataset_kwargs"]["data_files"]
    config["dataset_kwargs"]["data_files"] = {k: str(TASKS / v) for k, v in files.items()}
    return config


def engine_loglikelihood(engine: LlamaEngine, context: list[int], continuation: list[int]) -> float:
    """The engine's own sum of the continuation's logprobs after the context."""

    async def run() -> float:
        params = SamplingParams(max_tokens=0, prompt_logprobs=True)
        stream = engine.submit([*context, *continuation], params)
        async for _ in stream:
            pass
        scores = stream.result.prompt_logprobs[len(context) :]
        return sum(score.logprob for score in scores if score is not None)

    return asyncio.run(run())


def split(encode: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """How lm-eval tokenizes a pair: the context's trailing spaces go with the continuation,
    the whole is encoded, the context's tokens are its first tokens."""
    stripped = context.rstrip()
    continuation = context[len(stripped) :] + continuation
    whole = encode(stripped + continuation)
    n_context = len(encode(stripped))
    return whole[:n_context], whole[n_context:]


@pytest.mark.usefixtures("offline")
def test_multiple_choice_loglikelihoods_are_the_engines(base_url: str, engine: LlamaEngine) -> None:
    import tiktoken
    from lm_eval import simple_evaluate

    encoding = tiktoken.encoding_for_model("gpt-oss-20b")
    results = simple_evaluate(
        model="local-completions",
        model_args={
            "model": "gpt-oss-20b",  # tiktoken knows its encoding by this name
            "base_url": f"{base_url}/completions",
            "tokenizer_backend": "tiktoken",
            "num_concurrent": 1,
            "max_retries": 1,
        },
        tasks=[task("capitals_mc")],
        log_samples=True,
        bootstrap_iters=0,
    )
    assert results is not None
    samples = results["samples"]["capitals_mc"]
    assert len(samples) == 4
    correct = 0
    for sample in samples:
        pairs = sample["arguments"]
        reported = [resp[0][0] for resp in sample["resps"]]
        assert len(pairs) == len(reported) == 4
        expected = []
        for (context, continuation), value in zip(pairs, reported, strict=True):
            context_ids, continuation_ids = split(encoding.encode, context, continuation)
            assert continuation_ids
            expected.append(engine_loglikelihood(engine, context_ids, continuation_ids))
            assert value == pytest.approx(expected[-1], abs=1e-6)
        assert all(value < 0 for value in reported)
        best = max(range(4), key=lambda i: expected[i])
        correct += best == sample["doc"]["answer"]
    assert results["results"]["capitals_mc"]["acc,none"] == pytest.approx(correct / 4)


@pytest.mark.usefixtures("offline")
def test_generation_through_chat_completions(base_url: str, forced: ForcedScript) -> None:
    from lm_eval import simple_evaluate

    for _ in range(4):
        forced.push("<|channel|>final<|message|>Paris<|return|>")
    results = simple_evaluate(
        model="local-chat-completions",
        model_args={
            "model": "gpt-oss-20b",
            "base_url": f"{base_url}/chat/completions",
            "num_concurrent": 1,
            "max_retries": 1,
        },
        tasks=[task("capitals_gen")],
        apply_chat_template=True,
        log_samples=True,
        bootstrap_iters=0,
    )
    assert results is not None
    assert forced.pending == 0
    samples = results["samples"]["capitals_gen"]
    assert [sample["resps"][0][0] for sample in samples] == ["Paris"] * 4
    assert results["results"]["capitals_gen"]["exact_match,none"] == pytest.approx(0.25)
