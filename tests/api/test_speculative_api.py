"""Speculative decoding through the API: llama-server's draft timings, Prometheus counters, and
an answer that quotes the conversation streams exactly what it would without speculation."""

from __future__ import annotations

from fastapi.testclient import TestClient

from devkit.forced import ForcedScript
from tests.support.chat import chunks_of, joined, post, stream
from tests.support.metrics import metric
from tests.support.scripts import answer

QUOTED = (
    "def transfer(source, target, amount):\n"
    "    if amount <= 0:\n"
    "        raise ValueError('the amount must be positive')\n"
    "    source.withdraw(amount)\n"
    "    target.deposit(amount)\n"
)


def test_a_quoting_answer_reports_its_drafts(client: TestClient, forced: ForcedScript) -> None:
    drafted = metric(client, "gpt_oss_draft_tokens_total")
    accepted = metric(client, "gpt_oss_draft_tokens_accepted_total")
    messages = [{"role": "user", "content": f"Repeat this function:\n{QUOTED}"}]
    forced.push(answer(QUOTED))
    response = post(client, messages=messages, temperature=0)
    assert response.status_code == 200
    body = response.json()
    assert body["choices"][0]["message"]["content"] == QUOTED
    timings = body["timings"]
    # the answer copies the prompt: most of it was drafted, and the drafts were confirmed
    assert timings["draft_n_accepted"] > len(forced.encoding.encode(QUOTED)) // 2
    assert timings["draft_n"] >= timings["draft_n_accepted"]
    assert metric(client, "gpt_oss_draft_tokens_total") - drafted == timings["draft_n"]
    added = metric(client, "gpt_oss_draft_tokens_accepted_total") - accepted
    assert added == timings["draft_n_accepted"]


def test_a_quoting_answer_streams_the_same_text(client: TestClient, forced: ForcedScript) -> None:
    messages = [{"role": "user", "content": f"Quote it twice:\n{QUOTED}"}]
    forced.push(answer(QUOTED + QUOTED))
    lines = stream(client, messages=messages, temperature=0)
    assert joined(chunks_of(lines), "content") == QUOTED + QUOTED


def test_no_draft_fields_without_drafts(client: TestClient, forced: ForcedScript) -> None:
    forced.push(answer("Hello."))
    body = post(client, messages=[{"role": "user", "content": "Hi"}], max_tokens=4).json()
    assert "draft_n" not in body["timings"]
