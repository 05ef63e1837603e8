"""What the HTTP providers share: construction (the key, the URL, the pooled client), the
two calls of the :class:`~lousho_sync.providers.base.Provider` protocol, ``close()`` and the
context manager. A wire API adds only its request body and its response parsers.

``requests`` (and with it urllib3, http.client, ssl) is imported when the first provider is
made, not when lousho is: a process that never calls a model over HTTP (a CLI command on a
store, a worker on a scripted model) does not pay for it."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Self

from ..errors import ProviderError
from ..signal import Signal
from .base import ModelDone, ModelEvent, ModelRequest, ModelResponse

if TYPE_CHECKING:
    from ._http import Body

__all__ = ["HttpProvider"]


class HttpProvider:
    """The base of :class:`~lousho_sync.OpenAIProvider` and
    :class:`~lousho_sync.AnthropicProvider` (thread-safe: a ``requests.Session`` per
    thread). Subclasses set ``NAME`` and implement ``_body``, ``_whole`` and ``_streamed``.
    """

    NAME = ""
    HEADERS: Mapping[str, str] = {}
    """Extra headers on every request (an API version, say)."""

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        key_env: str,
        key_hint: str = "",
        auth_header: str,
        auth_prefix: str = "",
        base_url: str,
        path: str,
        timeout: float,
        connect_timeout: float,
        max_retries: int,
        backoff_s: float,
    ) -> None:
        from ._http import HeaderAuth, HttpClient, checked_secret

        secret = checked_secret(type(self).__name__, model, api_key, key_env, key_hint)
        self.model = model
        self.max_retries = max_retries
        """Retries of one call (a stream broken mid-way is made again within them)."""
        self.base_url = base_url
        self._url = base_url + path
        self._secret = secret
        self._http = HttpClient(
            provider=self.NAME,
            secret=secret,
            auth=HeaderAuth(auth_header, secret, auth_prefix),
            key_env=key_env,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_retries=max_retries,
            backoff_s=backoff_s,
        )

    def complete(self, request: ModelRequest, *, signal: Signal) -> ModelResponse:
        """Answer ``request`` in one (non-streamed) response."""
        events = self._http.post(
            self._url,
            self._body(request, stream=False),
            signal=signal,
            consume=self._whole,
            headers=dict(self.HEADERS),
        )
        try:
            for event in events:
                if isinstance(event, ModelDone):
                    return event.response
        finally:
            events.close()
        raise ProviderError(f"{self.NAME}: no response", provider=self.NAME)  # pragma: no cover

    def stream(self, request: ModelRequest, *, signal: Signal) -> Iterator[ModelEvent]:
        """Stream the answer as server-sent events."""
        yield from self._http.post(
            self._url,
            self._body(request, stream=True),
            signal=signal,
            consume=self._streamed,
            headers={**self.HEADERS, "Accept": "text/event-stream"},
        )

    def close(self) -> None:
        """Close pooled connections (idempotent)."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        from ._http import safe_url

        return f"{type(self).__name__}(model={self.model!r}, base_url={safe_url(self.base_url)!r})"

    # --- what a wire API provides ---------------------------------------------------------

    def _body(self, request: ModelRequest, *, stream: bool) -> dict[str, Any]:
        raise NotImplementedError

    def _whole(self, body: Body) -> Iterator[ModelEvent]:
        raise NotImplementedError

    def _streamed(self, body: Body) -> Iterator[ModelEvent]:
        raise NotImplementedError
