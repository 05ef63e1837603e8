"""HTTP machinery shared by the real providers: sessions, retries, errors, redaction.

The SSE parser (:mod:`._sse`) and the response builder (:mod:`._builder`) live in their own
modules; their public names are re-exported here for the providers.

Everything goes through ``requests``. One :class:`HttpClient` per provider object:

- a ``requests.Session`` per thread (a Session is not safe to share between threads), so
  connections are pooled per thread and reused between calls;
- ``(connect_timeout, timeout)`` on every request; the read timeout bounds every wait for
  bytes, so nothing hangs;
- retries with exponential backoff and jitter on 408/409/429/5xx and connection errors,
  honouring ``Retry-After`` (seconds or an HTTP date) and ``x-should-retry``, bounded by
  ``max_retries``; never once a stream has delivered a delta;
- abort: ``signal.add_callback`` shuts the connection's socket down, so a read blocked in
  another thread returns at once; whatever is raised after the abort becomes
  :class:`~lousho_sync.errors.AbortedError`;
- the API key (a :class:`Secret`) is redacted from every message this module builds.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import requests
import urllib3

from ..errors import AbortedError, ConfigError, ProviderError, RateLimitedError
from ..signal import Signal
from ._builder import ResponseBuilder
from ._conn import SessionHolder, Tracker, track
from ._secret import Secret, clip
from ._sse import SseEvent, iter_sse

__all__ = [
    "Body",
    "HeaderAuth",
    "HttpClient",
    "ResponseBuilder",
    "Secret",
    "SseEvent",
    "iter_sse",
    "retry_after_s",
    "safe_url",
]

_log = logging.getLogger(__name__)
T = TypeVar("T")

_RETRY_STATUSES = frozenset((408, 409, 429))
_DRAIN_TIMEOUT_S = 1.0
_MAX_ERROR_BODY = 65536


def checked_secret(
    provider: str, model: object, api_key: str | None, env: str, hint: str = ""
) -> Secret:
    """Check the model name and find the API key (the argument, then ``env``)."""
    if not isinstance(model, str) or not model:
        raise ConfigError(f"{provider}: model must be a non-empty str, got {model!r}")
    key = api_key or os.environ.get(env)
    if not key:
        raise ConfigError(f"{provider}: no API key; pass api_key= or set {env}{hint}")
    return Secret(key)


class HeaderAuth(requests.auth.AuthBase):
    """Puts the key in one header at send time (never in a dict the caller can log)."""

    def __init__(self, header: str, secret: Secret, prefix: str = "") -> None:
        self._header = header
        self._secret = secret
        self._prefix = prefix

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers[self._header] = self._prefix + self._secret.reveal()
        return r

    def __repr__(self) -> str:
        return f"HeaderAuth({self._header!r}, ***)"


def safe_url(url: str) -> str:
    """``url`` without a password in its user info (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    user = f"{parts.username}:***@" if parts.username else "***@"
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or HTTP date)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = lowered.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = lowered.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:  # pragma: no cover - older Pythons
        return None
    return max(0.0, when.timestamp() - time.time())


# --- Response bodies ----------------------------------------------------------------


class Body:
    """A 2xx response being read: raw chunks, SSE events or one JSON document.

    Transport failures while reading become retryable :class:`ProviderError`.
    """

    def __init__(self, resp: requests.Response, tracker: Tracker, client: HttpClient) -> None:
        self._resp = resp
        self._tracker = tracker
        self._client = client
        self._reader: Iterator[bytes] | None = None

    @property
    def is_json(self) -> bool:
        """True when the server answered ``application/json`` (not an event stream)."""
        ctype = self._resp.headers.get("Content-Type", "")
        return ctype.split(";")[0].strip().lower() == "application/json"

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (one reader per body: later calls continue it)."""
        if self._reader is None:
            self._reader = self._read()
        return self._reader

    def _read(self) -> Iterator[bytes]:
        raw = self._resp.raw
        try:
            if raw.chunked and raw.supports_chunked_reads():
                yield from raw.read_chunked(None, decode_content=True)
                return
            read1 = getattr(raw, "read1", None)
            if read1 is None:  # urllib3 1.x
                yield from raw.stream(8192, decode_content=True)
                return
            while data := read1(65536, decode_content=True):
                yield data
        except (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError) as exc:
            broken: BaseException = exc
        else:
            return
        # raised outside the except block: nothing of the original is chained or kept
        raise self._client.transport_error(broken, self._resp.url, reading=True)

    def sse(self) -> Iterator[SseEvent]:
        """The body as server-sent events."""
        return iter_sse(self.chunks())

    def json(self) -> Any:
        """The whole body parsed as JSON."""
        return self.parse(b"".join(self.chunks()).decode("utf-8", errors="replace"))

    def parse(self, text: str) -> Any:
        """``text`` parsed as JSON; invalid JSON is a (not retryable) :class:`ProviderError`."""
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            bad = exc  # its .doc is the whole body, which may echo the key
        name, secret = self._client.provider, self._client.secret
        err = ProviderError(
            f"{name}: the server sent invalid JSON ({bad.msg} at char {bad.pos}): "
            f"{secret.redact(text[:200])!r}",
            error_type="invalid_response",
            provider=name,
        )
        raise err from secret.stand_in(bad)

    def drain(self) -> None:
        """Read the rest of a finished stream briefly, so the connection can be reused."""
        sock = self._tracker.sock
        if sock is None:
            return
        try:
            sock.settimeout(_DRAIN_TIMEOUT_S)
            for _ in self.chunks():
                pass
        except Exception:  # the connection is just not reused
            _log.debug("could not drain the response; the connection is dropped")


# --- The client ---------------------------------------------------------------------


class HttpClient:
    """POSTs JSON for one provider, with retries, timeouts and abort.

    Thread-safe: each thread gets its own ``requests.Session`` (created on first use and
    closed when the thread ends, when the client is collected, or on :meth:`close`);
    ``_lock`` guards the set of sessions.
    """

    def __init__(
        self,
        *,
        provider: str,
        secret: Secret,
        auth: requests.auth.AuthBase,
        key_env: str,
        timeout: float,
        connect_timeout: float,
        max_retries: int,
        backoff_s: float,
        max_backoff_s: float = 8.0,
        max_retry_after_s: float = 60.0,
    ) -> None:
        for name, value in (
            ("timeout", timeout),
            ("connect_timeout", connect_timeout),
        ):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{provider}: {name} must be a number > 0, got {value!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigError(f"{provider}: max_retries must be an int >= 0, got {max_retries!r}")
        if not isinstance(backoff_s, (int, float)) or backoff_s < 0:
            raise ConfigError(f"{provider}: backoff_s must be a number >= 0, got {backoff_s!r}")
        self.provider = provider
        self.secret = secret
        self._auth = auth
        self._key_env = key_env
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self.max_retries = max_retries
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._holders: weakref.WeakSet[SessionHolder] = weakref.WeakSet()

    def _session(self) -> requests.Session:
        holder: SessionHolder | None = getattr(self._local, "holder", None)
        if holder is None:
            holder = SessionHolder()
            self._local.holder = holder
            with self._lock:
                self._holders.add(holder)
        return holder.session

    def close(self) -> None:
        """Close every pooled connection (idempotent; later calls open new ones)."""
        with self._lock:
            holders = list(self._holders)
        for holder in holders:
            holder.session.close()

    def post(
        self,
        url: str,
        body: Mapping[str, Any],
        *,
        signal: Signal,
        consume: Callable[[Body], Iterator[T]],
        headers: Mapping[str, str] | None = None,
    ) -> Generator[T, None, None]:
        """POST ``body`` to ``url`` and yield what ``consume`` makes of the 2xx response.

        Retries (429, 5xx, connection errors, a stream that broke before yielding) until
        ``max_retries``; nothing is retried once ``consume`` has yielded.
        """
        payload = json.dumps(body, ensure_ascii=False).encode("utf-8")
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        attempt = 0
        while True:
            signal.raise_if_aborted()
            delivered = False
            failure: ProviderError | None = None
            wait_s: float | None = None
            tracker = Tracker()
            remove = signal.add_callback(tracker.abort)
            try:
                resp = self._send(url, payload, all_headers, tracker)
                try:
                    if 200 <= resp.status_code < 300:
                        for item in consume(Body(resp, tracker, self)):
                            if signal.aborted:
                                raise _aborted(signal)
                            delivered = True
                            yield item
                        return
                    failure, wait_s = self._status_failure(resp), retry_after_s(resp.headers)
                finally:
                    tracker.detach()
                    resp.close()
            except ProviderError as exc:
                if signal.aborted:
                    raise _aborted(signal) from exc
                failure = exc
            except AbortedError:
                raise
            except Exception as exc:
                if signal.aborted:
                    raise _aborted(signal) from exc
                raise
            finally:
                remove()
            if signal.aborted:
                raise _aborted(signal) from failure
            assert failure is not None
            if delivered or not failure.retryable or attempt >= self.max_retries:
                raise self._final(failure, attempt)
            delay = self._delay(attempt, wait_s)
            _log.warning(
                "%s: attempt %d of %d failed (%s); retrying in %.3fs%s",
                self.provider,
                attempt + 1,
                self.max_retries + 1,
                failure,
                delay,
                " (Retry-After)" if wait_s is not None and delay == wait_s else "",
            )
            if signal.wait(delay):
                raise _aborted(signal) from failure
            attempt += 1

    def _send(
        self, url: str, payload: bytes, headers: Mapping[str, str], tracker: Tracker
    ) -> requests.Response:
        session = self._session()
        _log.debug("%s: POST %s", self.provider, safe_url(url))
        track(tracker)
        # requests' exceptions hold the prepared request, auth header included: they are
        # turned into errors that chain only a stand-in, raised outside the except block
        failed: requests.exceptions.RequestException
        try:
            resp = session.post(
                url,
                data=payload,
                headers=dict(headers),
                auth=self._auth,
                timeout=(self.connect_timeout, self.timeout),
                stream=True,
                allow_redirects=False,
            )
        except requests.exceptions.RequestException as exc:
            failed = exc
        else:
            tracker.set_response(resp)
            return resp
        finally:
            track(None)
        if isinstance(
            failed,
            (
                requests.exceptions.InvalidURL,
                requests.exceptions.MissingSchema,
                requests.exceptions.InvalidSchema,
            ),
        ):
            raise ConfigError(
                f"{self.provider}: bad base_url, cannot POST to {safe_url(url)!r}: "
                f"{self.secret.redact(str(failed))}"
            ) from self.secret.stand_in(failed)
        raise self.transport_error(failed, url, reading=False)

    def transport_error(self, exc: BaseException, url: str, *, reading: bool) -> ProviderError:
        """A :class:`ProviderError` for a timeout, refused connection or broken stream.

        It chains only a text stand-in of ``exc``: raise it outside the ``except`` block.
        """
        where = safe_url(url)
        retryable = not isinstance(exc, requests.exceptions.SSLError)
        error_type = "timeout"
        if isinstance(exc, requests.exceptions.ConnectTimeout):
            what = f"could not connect to {where} within {self.connect_timeout:g}s"
        elif isinstance(
            exc,
            (requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError, TimeoutError),
        ):
            what = f"no data from {where} for {self.timeout:g}s (read timeout)"
        elif reading:
            error_type = "connection_error"
            what = f"the connection to {where} broke while reading the response"
        else:
            error_type = "connection_error"
            what = f"could not reach {where}"
        detail = self.secret.redact(str(exc))
        err = ProviderError(
            f"{self.provider}: {what}: {detail}",
            error_type=error_type,
            retryable=retryable,
            provider=self.provider,
        )
        err.__cause__ = self.secret.stand_in(exc)
        return err

    def _status_failure(self, resp: requests.Response) -> ProviderError:
        status = resp.status_code
        try:
            raw = resp.raw.read(_MAX_ERROR_BODY, decode_content=True) or b""
        except Exception:
            raw = b""
        message, error_type = _error_details(raw)
        hint = ""
        if status == 401 or status == 403:
            hint = f" (check the API key: api_key= or {self._key_env})"
        elif status == 404:
            hint = f" (check the model name and the base URL; POST {safe_url(resp.url)})"
        elif 300 <= status < 400:
            hint = f" (redirect to {safe_url(resp.headers.get('Location', '?'))} not followed)"
        request_id = resp.headers.get("x-request-id") or resp.headers.get("request-id")
        text = f"{self.provider} answered HTTP {status}"
        if resp.reason:
            text += f" {resp.reason}"
        if error_type:
            text += f" ({error_type})"
        if message:
            text += f": {message}"
        text += hint
        if request_id:
            text += f" [request id {request_id}]"
        should = resp.headers.get("x-should-retry", "").lower()
        retryable = (
            should == "true"
            if should in ("true", "false")
            else status in _RETRY_STATUSES or status >= 500
        )
        cls = RateLimitedError if status == 429 else ProviderError
        return cls(
            self.secret.redact(text),
            status=status,
            error_type=error_type,
            retryable=retryable,
            provider=self.provider,
        )

    def _final(self, failure: ProviderError, attempt: int) -> ProviderError:
        if attempt == 0:
            return failure
        final = type(failure)(
            f"{failure} (gave up after {attempt + 1} attempts)",
            status=failure.status,
            error_type=failure.error_type,
            retryable=failure.retryable,
            provider=failure.provider,
        )
        final.__cause__ = failure
        return final

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None and retry_after <= self.max_retry_after_s:
            return retry_after
        base: float = min(self.backoff_s * (2.0**attempt), self.max_backoff_s)
        return base * (1.0 - 0.25 * random.random())


def _aborted(signal: Signal) -> AbortedError:
    return AbortedError(f"aborted: {signal.reason}", reason=signal.reason)


def _error_details(raw: bytes) -> tuple[str, str | None]:
    """The provider's error message and type from an error body (any common shape)."""
    text = raw.decode("utf-8", errors="replace").strip()
    try:
        data = json.loads(text)
    except ValueError:
        return clip(text), None
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, str):
            return clip(err), None
        if isinstance(err, dict):
            etype = err.get("type") or err.get("code")
            msg = err.get("message") or err.get("detail") or data.get("detail")
            return clip(str(msg) if msg is not None else text), (
                str(etype) if etype is not None else None
            )
    return clip(text), None
