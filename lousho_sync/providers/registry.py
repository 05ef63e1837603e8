"""Model strings: ``"<provider>/<model>"`` resolved to a provider object.

``openai/...`` and ``anthropic/...`` are built in; :func:`register_provider` adds more
(or replaces one). The model part may itself contain ``/`` (``openai/meta-llama/x``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import ConfigError
from .anthropic import AnthropicProvider
from .base import Provider
from .openai import OpenAIProvider

__all__ = ["ProviderFactory", "register_provider", "resolve_model"]

ProviderFactory = Callable[[str], Provider]

_lock = threading.Lock()
_factories: dict[str, ProviderFactory] = {
    "anthropic": AnthropicProvider,
    "openai": OpenAIProvider,
}


def register_provider(prefix: str, factory: ProviderFactory) -> None:
    """Make ``"<prefix>/<model>"`` resolve to ``factory(model)``; replaces an earlier one.

    Thread-safe. ``prefix`` is a non-empty string without ``/``.
    """
    if not isinstance(prefix, str) or not prefix or "/" in prefix:
        raise ConfigError(f"a provider prefix is a non-empty str without '/', got {prefix!r}")
    if not callable(factory):
        raise ConfigError(f"the factory for provider prefix {prefix!r} is not callable")
    with _lock:
        _factories[prefix] = factory


def resolve_model(model: str) -> Provider:
    """The provider for ``"<provider>/<model>"``, e.g. ``resolve_model("openai/gpt-4o")``.

    Keys and base URLs come from the environment (``OPENAI_API_KEY``, ...). An unknown
    prefix or a string without ``/`` is a :class:`ConfigError` naming the known prefixes.
    """
    with _lock:
        known = sorted(_factories)
        prefix, slash, name = model.partition("/") if isinstance(model, str) else ("", "", "")
        factory = _factories.get(prefix)
    if not isinstance(model, str) or not slash or not name or factory is None:
        why = (
            "is not of the form '<provider>/<model>'"
            if not isinstance(model, str) or not slash or not name
            else f"names an unknown provider {prefix!r}"
        )
        raise ConfigError(
            f"model {model!r} {why}; known providers: {', '.join(known)} "
            "(register_provider() adds one)"
        )
    return factory(name)
