"""Budgets priced as real providers report: dated model names, prompt-cache tokens at their
own rates, and a cost limit on a model that cannot be priced refused before a paid call.
The providers talk to a loopback server answering as the real APIs do."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from _http_server import FakeServer, fixture_body, json_reply

from lousho_sync import (
    AnthropicProvider,
    ConfigError,
    Limits,
    OpenAIProvider,
    Price,
    Usage,
    create_agent,
)
from lousho_sync.limits import model_names, price_for
from lousho_sync.sqlite import SqliteStore

KEY = "sk-test-prices-0123456789"


def openai_answer(model: str, prompt: int, cached: int, completion: int) -> Any:
    body = copy.deepcopy(fixture_body("openai_text.json"))
    body["model"] = model
    body["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                     "total_tokens": prompt + completion,
                     "prompt_tokens_details": {"cached_tokens": cached}}
    return json_reply(body)


def anthropic_answer(model: str, fresh: int, read: int, write: int, output: int) -> Any:
    body = copy.deepcopy(fixture_body("anthropic_text.json"))
    body["model"] = model
    body["usage"] = {"input_tokens": fresh, "cache_read_input_tokens": read,
                     "cache_creation_input_tokens": write, "output_tokens": output}
    return json_reply(body)


def openai(server: FakeServer, model: str = "gpt-4o-mini") -> OpenAIProvider:
    return OpenAIProvider(model, api_key=KEY, base_url=server.url + "/v1", max_retries=0)


def anthropic(server: FakeServer, model: str = "claude-3-5-haiku-latest") -> AnthropicProvider:
    return AnthropicProvider(model, api_key=KEY, base_url=server.url, max_retries=0)


def test_model_names_drop_provider_prefixes_dates_and_latest() -> None:
    assert model_names("gpt-4o-mini-2024-07-18") == ["gpt-4o-mini-2024-07-18", "gpt-4o-mini"]
    assert model_names("claude-3-5-haiku-20241022")[-1] == "claude-3-5-haiku"
    assert model_names("anthropic/claude-sonnet-4-20250514")[-1] == "claude-sonnet-4"
    assert model_names("claude-3-5-haiku-latest")[-1] == "claude-3-5-haiku"
    assert model_names("o3-mini") == ["o3-mini"]


def test_dated_names_find_the_shipped_prices_and_overrides_win() -> None:
    for reported in ("gpt-4o-mini-2024-07-18", "claude-3-5-haiku-20241022",
                     "claude-sonnet-4-20250514", "openai/gpt-4o-2024-08-06"):
        assert price_for(reported, None) is not None, reported
    mine = Price(1.0, 2.0)
    assert price_for("gpt-4o-mini-2024-07-18", {"gpt-4o-mini": mine}) is mine


def test_openai_dated_model_and_cached_tokens_are_priced_and_kept(
    server: FakeServer, tmp_path: Path
) -> None:
    # 1M input tokens of which 800k were read from the cache: 200k x 0.15 + 800k x 0.075
    server.default = openai_answer("gpt-4o-mini-2024-07-18", 1_000_000, 800_000, 0)
    with SqliteStore(tmp_path / "a.db") as store:
        agent = create_agent(provider=openai(server), store=store,
                             limits=Limits(max_cost_usd=5.0))
        session = agent.session(id="u1", limits=Limits(max_cost_usd=5.0))
        first = session.send("Hi")
        second = session.send("Again")
        assert first.usage.cost_usd == pytest.approx(0.09)
        assert first.usage.cache_read_tokens == 800_000
        assert (first.usage + second.usage).cost_usd == pytest.approx(0.18)
    with SqliteStore(tmp_path / "a.db") as store:  # the cache tokens survive the codec
        reloaded = create_agent(provider=openai(server), store=store).session(id="u1")
        usages = [m.usage for m in reloaded.load() if m.usage is not None]
        assert [u.cache_read_tokens for u in usages] == [800_000, 800_000]
        assert sum(u.cost_usd or 0 for u in usages) == pytest.approx(0.18)


def test_anthropic_cache_reads_and_writes_have_their_own_rates(server: FakeServer) -> None:
    # 200k fresh input, 800k cache reads: 0.16 + 0.064 = 0.224 (not 0.80 at the input rate)
    server.push(anthropic_answer("claude-3-5-haiku-20241022", 200_000, 800_000, 0, 0))
    # cache writes cost 1.25x the input rate: 100k x 1.00 / 1M
    server.push(anthropic_answer("claude-3-5-haiku-20241022", 0, 0, 100_000, 0))
    agent = create_agent(provider=anthropic(server), limits=Limits(max_cost_usd=5.0))
    reads = agent.send("Hi").usage
    assert reads == Usage(1_000_000, 0, pytest.approx(0.224), 800_000, 0)  # type: ignore[arg-type]
    writes = agent.send("Hi").usage
    assert writes.cache_write_tokens == 100_000
    assert writes.cost_usd == pytest.approx(0.1)


def test_an_unknown_reported_model_is_priced_by_the_configured_one(server: FakeServer) -> None:
    server.default = openai_answer("my-router-alias-7", 1_000_000, 0, 0)
    agent = create_agent(provider=openai(server, "gpt-4o-mini"), limits=Limits(max_cost_usd=5))
    assert agent.send("Hi").usage.cost_usd == pytest.approx(0.15)


@pytest.mark.parametrize("make", [openai, anthropic], ids=["openai", "anthropic"])
def test_a_cost_limit_on_an_unpriced_model_fails_before_any_paid_call(
    server: FakeServer, make: Any
) -> None:
    server.default = openai_answer("mystery-model", 10, 0, 10)
    agent = create_agent(provider=make(server, "mystery-model"), limits=Limits(max_cost_usd=1))
    session = agent.session()
    for _ in range(3):  # every retry is refused the same way, and nothing is paid for
        with pytest.raises(ConfigError, match=r"no price is known for model 'mystery-model'.*"
                                              r"prices=\{'mystery-model': Price"):
            session.send("Hi")
    assert server.requests == []
    assert session.pending() is None and session.messages == ()
    agent.session(limits=None)  # without a cost limit the model is usable
    free = create_agent(provider=make(server, "mystery-model"))
    assert free.send("Hi").usage.cost_usd is None


def test_a_session_cost_limit_on_an_unpriced_model_also_fails_first(server: FakeServer) -> None:
    agent = create_agent(provider=openai(server, "mystery-model"))
    session = agent.session(limits=Limits(max_cost_usd=1))
    with pytest.raises(ConfigError, match="no price is known"):
        session.send("Hi")
    assert server.requests == []
