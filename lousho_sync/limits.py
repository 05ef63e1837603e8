"""Budgets (:class:`Limits`), the price table and cost accounting."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources

import attrs

from .errors import ConfigError
from .messages import Usage

__all__ = ["Counters", "Limits", "Price", "cost_of", "default_prices"]


@attrs.frozen(slots=True, kw_only=True)
class Limits:
    """Budgets. On ``create_agent`` they bound each turn; on ``agent.session`` the sum over
    the session's transcript. ``None`` means unlimited."""

    max_steps: int | None = None
    max_tool_calls: int | None = None
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    max_cost_usd: float | None = None


@attrs.frozen(slots=True)
class Price:
    """USD per million input and output tokens."""

    input_per_mtok: float
    output_per_mtok: float


@attrs.frozen(slots=True)
class Counters:
    """What a turn (or a session) has used so far."""

    steps: int = 0
    tool_calls: int = 0
    usage: Usage = Usage()

    def add(self, *, steps: int = 0, tool_calls: int = 0, usage: Usage | None = None) -> Counters:
        """A copy with the given amounts added."""
        return Counters(
            self.steps + steps,
            self.tool_calls + tool_calls,
            self.usage if usage is None else self.usage + usage,
        )

    def __add__(self, other: Counters) -> Counters:
        return Counters(
            self.steps + other.steps, self.tool_calls + other.tool_calls, self.usage + other.usage
        )


def exceeded_before_model_call(limits: Limits | None, used: Counters) -> str | None:
    """The name of the limit that forbids another model call, or None."""
    if limits is None:
        return None
    if limits.max_steps is not None and used.steps >= limits.max_steps:
        return "max_steps"
    return _exceeded_usage(limits, used.usage)


def exceeded_before_tool_call(limits: Limits | None, used: Counters) -> str | None:
    """The name of the limit that forbids another tool call, or None."""
    if limits is None:
        return None
    if limits.max_tool_calls is not None and used.tool_calls >= limits.max_tool_calls:
        return "max_tool_calls"
    return _exceeded_usage(limits, used.usage)


def _exceeded_usage(limits: Limits, usage: Usage) -> str | None:
    if limits.max_input_tokens is not None and usage.input_tokens >= limits.max_input_tokens:
        return "max_input_tokens"
    if limits.max_output_tokens is not None and usage.output_tokens >= limits.max_output_tokens:
        return "max_output_tokens"
    if (
        limits.max_cost_usd is not None
        and usage.cost_usd is not None
        and usage.cost_usd >= limits.max_cost_usd
    ):
        return "max_cost_usd"
    return None


@cache
def default_prices() -> Mapping[str, Price]:
    """The shipped price table (``prices.json``), keyed by model name."""
    raw = json.loads(resources.files("lousho_sync").joinpath("prices.json").read_text("utf-8"))
    return {
        name: Price(float(p["input_per_mtok"]), float(p["output_per_mtok"]))
        for name, p in raw["models"].items()
    }


def price_for(model: str | None, prices: Mapping[str, Price] | None) -> Price | None:
    """The price of ``model``: the overrides first, then the shipped table."""
    if model is None:
        return None
    if prices is not None and model in prices:
        return prices[model]
    table = default_prices()
    if model in table:
        return table[model]
    base = model.rsplit("/", 1)[-1]
    return table.get(base)


def cost_of(
    usage: Usage,
    model: str | None,
    prices: Mapping[str, Price] | None = None,
    *,
    required: bool = False,
) -> Usage:
    """``usage`` with ``cost_usd`` filled from the price table when the provider gave none.

    When no cost can be known and ``required`` (a cost limit is set), raise ConfigError.
    """
    if usage.cost_usd is not None:
        return usage
    price = price_for(model, prices)
    if price is None:
        if required:
            raise ConfigError(
                f"no price is known for model {model!r} and a cost limit is set: pass "
                "create_agent(prices={model: Price(input_per_mtok, output_per_mtok)}) or "
                "remove max_cost_usd"
            )
        return usage
    cost = (usage.input_tokens * price.input_per_mtok + usage.output_tokens * price.output_per_mtok)
    return Usage(usage.input_tokens, usage.output_tokens, cost / 1_000_000)
