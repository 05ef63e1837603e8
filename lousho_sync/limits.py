"""Budgets (:class:`Limits`), the price table and cost accounting."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from importlib import resources

import attrs

from .errors import ConfigError
from .messages import Usage

__all__ = [
    "Counters",
    "Limits",
    "Price",
    "cost_of",
    "default_prices",
    "model_names",
    "no_price_error",
    "price_for",
]


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
    """USD per million input and output tokens; cached input tokens read from (or written
    to) the provider's prompt cache at their own rates (None: the input rate)."""

    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None

    def cost(self, usage: Usage) -> float:
        """USD for ``usage``."""
        read, write = usage.cache_read_tokens, usage.cache_write_tokens
        plain = max(usage.input_tokens - read - write, 0)
        rate_read = self.input_per_mtok if self.cache_read_per_mtok is None else (
            self.cache_read_per_mtok)
        rate_write = self.input_per_mtok if self.cache_write_per_mtok is None else (
            self.cache_write_per_mtok)
        total = (plain * self.input_per_mtok + read * rate_read + write * rate_write
                 + usage.output_tokens * self.output_per_mtok)
        return total / 1_000_000


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
    """The shipped price table (``prices.json``), keyed by model name (dates and
    ``-latest`` left out: see :func:`price_for`)."""
    raw = json.loads(resources.files("lousho_sync").joinpath("prices.json").read_text("utf-8"))
    return {
        name: Price(
            float(p["input_per_mtok"]),
            float(p["output_per_mtok"]),
            None if p.get("cache_read_per_mtok") is None else float(p["cache_read_per_mtok"]),
            None if p.get("cache_write_per_mtok") is None else float(p["cache_write_per_mtok"]),
        )
        for name, p in raw["models"].items()
    }


_DATED = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")


def model_names(model: str) -> list[str]:
    """The names a price may be kept under, best first: ``model``, without a
    ``provider/`` prefix, and each without a date suffix (``-2024-07-18``,
    ``-20241022``) or ``-latest``."""
    names = [model]
    base = model.rsplit("/", 1)[-1]
    if base != model:
        names.append(base)
    for name in list(names):
        plain = _DATED.sub("", name)
        if plain != name and plain:
            names.append(plain)
    return names


def price_for(model: str | None, prices: Mapping[str, Price] | None) -> Price | None:
    """The price of ``model``: the overrides first, then the shipped table, each under the
    names of :func:`model_names`."""
    if not model:
        return None
    names = model_names(model)
    for table in (prices, default_prices()):
        if table:
            for name in names:
                if name in table:
                    return table[name]
    return None


def no_price_error(model: str | None) -> ConfigError:
    """The error for a cost limit on a model that cannot be priced."""
    shown = model if model else "(the provider names none)"
    return ConfigError(
        f"no price is known for model {shown!r} and a cost limit (max_cost_usd) is set: add "
        f"one with create_agent(prices={{{model or 'MODEL'!r}: Price(input_per_mtok=..., "
        "output_per_mtok=...)}), or remove max_cost_usd"
    )


def cost_of(
    usage: Usage,
    model: str | None,
    prices: Mapping[str, Price] | None = None,
    *,
    required: bool = False,
    configured: str | None = None,
) -> Usage:
    """``usage`` with ``cost_usd`` filled from the price table when the provider gave none:
    the price of the ``model`` the provider reported, else of the ``configured`` one.

    When no cost can be known and ``required`` (a cost limit is set), raise ConfigError.
    """
    if usage.cost_usd is not None:
        return usage
    price = price_for(model, prices) or price_for(configured, prices)
    if price is None:
        if required:
            raise no_price_error(model or configured)
        return usage
    return attrs.evolve(usage, cost_usd=price.cost(usage))
