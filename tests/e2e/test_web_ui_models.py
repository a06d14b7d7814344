"""The chat page's model menu in a real browser (Debian's chromium), against a real server that
serves two models: the synthetic `tiny` and `tiny-wide` GGUFs as `alpha` and `beta`, under a
memory budget that holds one of them (a choice of the other swaps it in).

The menu lists exactly the served models; what is chosen is what the page's requests name, and
the server says which model answered (its per-model generation counter); a second choice
switches every later request.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator

import httpx
import pytest
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.select import Select

from devkit.models import cached_gguf
from devkit.serving import served
from server.app import create_app
from server.ops.runtime import ServedModels
from server.ops.settings import Settings
from server.ops.startup import engine_config, load_models, memory_estimate
from tests.support import chat_page
from tests.support.chat_page import (
    GatedScript,
    console_errors,
    last_answer,
    open_page,
    record_requests,
    say,
    text_of,
)

pytestmark = pytest.mark.slow  # a real browser (Debian's chromium), two models

script = chat_page.script
browser = chat_page.browser
_release_gate = chat_page._release_gate

GIB = 1024**3
START_S = 180.0  # the first model loaded and both checked, on a busy machine


@pytest.fixture(scope="module")
def models(script: GatedScript, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedModels]:
    """alpha and beta, each with the forced script; a budget for either alone, not both."""
    directory = tmp_path_factory.mktemp("menu")
    alpha, beta = directory / "alpha.gguf", directory / "beta.gguf"
    shutil.copyfile(cached_gguf("tiny"), alpha)
    shutil.copyfile(cached_gguf("tiny-wide"), beta)
    base = Settings(
        model=(str(alpha), str(beta)),
        n_ctx=4096,
        n_slots=2,
        n_threads=2,
        prompt_cache=False,
        cache_dir=directory / "cache",
        responses_store_path=directory / "state" / "responses.sqlite3",
    )
    costs = [memory_estimate(engine_config(base, path)) for path in (alpha, beta)]
    settings = base.model_copy(update={"models_memory_gb": (max(costs) + min(costs) // 2) / GIB})
    served_models = load_models(settings, sampling_hook=script)
    yield served_models
    served_models.close()


@pytest.fixture(scope="module")
def root(models: ServedModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("menu-app")
    settings = Settings(
        cache_dir=directory / "cache",
        responses_store_path=directory / "state" / "responses.sqlite3",
    )
    with served(create_app(settings, models), start_s=START_S) as url:
        yield url


def answered(root: str) -> dict[str, int]:
    """How many generations each model finished, by the server's own count (/metrics)."""
    counts = {"alpha": 0, "beta": 0}
    metrics = httpx.get(f"{root}/metrics", timeout=30).text
    for model, value in re.findall(
        r'^gpt_oss_generations_total\{model="(\w+)",reason="\w+"\} ([\d.]+)$', metrics, re.M
    ):
        counts[model] += int(float(value))
    return counts


def ask(browser: WebDriver, script: GatedScript, text: str, answer: str, count: int) -> None:
    script.push(f"<|channel|>final<|message|>{answer}<|return|>")
    say(browser, text)
    done = last_answer(browser, count=count)
    assert text_of(done, ".answer") == answer


def test_the_menu_lists_the_served_models_and_its_choice_is_what_answers(
    browser: WebDriver, root: str, script: GatedScript
) -> None:
    open_page(browser, root)
    menu = browser.find_element(By.ID, "model-choice")
    assert menu.is_displayed()
    assert not browser.find_element(By.ID, "model-name").is_displayed()
    choice = Select(menu)
    # the served models by their ids, not their aliases (gpt-oss:20b, ...) nor other names
    assert [o.get_attribute("value") for o in choice.options] == ["alpha", "beta"]
    assert [o.text for o in choice.options] == ["alpha", "beta"]
    assert choice.first_selected_option.text == "alpha"  # the server's default
    record_requests(browser)

    before = answered(root)
    ask(browser, script, "Hello?", "Alpha answers.", 1)
    assert answered(root) == {**before, "alpha": before["alpha"] + 1}

    choice.select_by_visible_text("beta")  # not loaded: this request swaps it in
    ask(browser, script, "And you?", "Beta answers.", 2)
    assert answered(root) == {"alpha": before["alpha"] + 1, "beta": before["beta"] + 1}
    states = {m["id"]: m["model_state"] for m in httpx.get(f"{root}/v1/server").json()["models"]}
    assert states == {"alpha": "unloaded", "beta": "loaded"}

    ask(browser, script, "Once more?", "Beta again.", 3)  # the choice stays
    choice.select_by_visible_text("alpha")  # and switches back
    ask(browser, script, "Back to you.", "Alpha again.", 4)
    assert answered(root) == {"alpha": before["alpha"] + 2, "beta": before["beta"] + 2}

    bodies = browser.execute_script("return window.__bodies;")
    assert [body.get("model") for body in bodies] == ["alpha", "beta", "beta", "alpha"]
    assert Select(browser.find_element(By.ID, "model-choice")).first_selected_option.text == (
        "alpha"
    )
    assert console_errors(browser) == []
