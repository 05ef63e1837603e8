"""``lousho serve`` over HTTP, as a client meets it: a real server on 127.0.0.1 in a child
process, a real SQLite file, turns paused by other processes. The token (401 without it, a
cookie that is HttpOnly and SameSite=Strict), CSRF (403), escaping, the security headers,
resolve-once (409 saying who decided), read-only without an agent, the WSGI callable
mounted in another server, and a running turn's events streamed live. What a browser does
with the pages: tests/browser/."""

from __future__ import annotations

import html
import http.client
import json
import re
import threading
import urllib.parse
from pathlib import Path

import pytest
from _serve import TOKEN, Served, pause

from lousho_sync.errors import ConfigError
from lousho_sync.inbox import COOKIE, inbox_app, make_inbox_server
from lousho_sync.sqlite import SqliteStore

PAYLOAD = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: str) -> None:
        self.status, self.headers, self.body = status, headers, body


def call(url: str, path: str, *, method: str = "GET", token: str | None = TOKEN,
         cookie: str | None = None, form: dict[str, str] | None = None) -> Reply:
    """One HTTP request (no redirect followed); ``token`` goes as a Bearer header."""
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    headers: dict[str, str] = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if cookie is not None:
        headers["Cookie"] = cookie
    body = None
    if form is not None:
        body = urllib.parse.urlencode(form)
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()},
                     r.read().decode("utf-8"))
    finally:
        conn.close()


def csrf_of(page: str) -> str:
    m = re.search(r'name=csrf value="([0-9a-f]+)"', page)
    assert m, page
    return m.group(1)


def test_every_request_needs_the_token_and_a_browser_keeps_it_in_a_strict_cookie(
    tmp_path: Path
) -> None:
    db = tmp_path / "agent.db"
    pause(db, "s1", metadata='{"title": "Refunds"}')
    with Served(db) as served:
        for path in ("/", "/inbox", "/sessions", "/sessions/s1", "/static/inbox.js"):
            refused = call(served.url, path, token=None)
            assert refused.status == 401, path
            assert "token" in refused.body and "lousho serve" in refused.body
            assert refused.headers["content-security-policy"] == "default-src 'self'"
        assert call(served.url, "/inbox", token="wrong-token-0123456789").status == 401
        assert call(served.url, "/inbox?token=wrong", token=None).status == 401
        assert call(served.url, "/inbox", token=None, cookie=f"{COOKIE}=nope").status == 401
        entry = call(served.url, f"/sessions?prefix=s&token={TOKEN}", token=None)
        assert entry.status == 303 and entry.headers["location"] == "/sessions?prefix=s"
        cookie = entry.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}={TOKEN};")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        page = call(served.url, "/sessions?prefix=s", token=None, cookie=f"{COOKIE}={TOKEN}")
        assert page.status == 200 and '<a href="/sessions/s1">s1</a>' in page.body
        assert "&quot;title&quot;: &quot;Refunds&quot;" in page.body
        for name, value in (("content-security-policy", "default-src 'self'"),
                            ("x-content-type-options", "nosniff"),
                            ("referrer-policy", "no-referrer")):
            assert page.headers[name] == value


def test_a_post_without_the_csrf_token_is_refused_and_decides_nothing(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    aid = pause(db, "s1")
    with Served(db) as served:
        for form in ({"decision": "approve"}, {"decision": "approve", "csrf": "0" * 64}):
            refused = call(served.url, f"/approvals/{aid}/decide", method="POST", form=form)
            assert refused.status == 403 and "CSRF" in refused.body
        no_token = call(served.url, f"/approvals/{aid}/decide", method="POST", token=None,
                        form={"decision": "approve"})
        assert no_token.status == 401
    with SqliteStore(db) as store:
        record = store.approvals.get(aid)
        assert record is not None and record.status == "pending"


def test_approve_continues_the_turn_and_the_loser_is_told_who_decided(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    aid = pause(db, "team-1")
    with Served(db) as served:
        inbox = call(served.url, "/inbox")
        assert inbox.status == 200 and f'id="approval-{aid}"' in inbox.body
        csrf = csrf_of(inbox.body)
        barrier = threading.Barrier(2)
        replies: dict[str, Reply] = {}

        def decide(who: str) -> None:
            barrier.wait(timeout=60)
            replies[who] = call(served.url, f"/approvals/{aid}/decide", method="POST",
                                form={"csrf": csrf, "decision": "approve", "by": who,
                                      "reason": f"{who} checked"})

        threads = [threading.Thread(target=decide, args=(w,)) for w in ("alice", "bob")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        won = [w for w, r in replies.items() if r.status == 303]
        lost = [w for w, r in replies.items() if r.status == 409]
        assert len(won) == 1 and len(lost) == 1, {w: r.status for w, r in replies.items()}
        winner, loser = won[0], lost[0]
        assert replies[winner].headers["location"] == f"/sessions/team-1?decided={aid}"
        told = replies[loser].body
        assert f"Already approved by <strong class=decider>{winner}</strong>" in told
        assert f"reason: {winner} checked" in told
        page = call(served.url, replies[winner].headers["location"])
        assert "outcome: paid 5 to bob" in page.body
        assert f"pay approved by {winner}: {winner} checked; the turn went on." in page.body
        assert '<p class=muted id=pending>None.</p>' in page.body
        assert "No approval is waiting." in call(served.url, "/inbox").body


def test_text_from_transcripts_arguments_and_metadata_is_escaped(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    args = json.dumps({"amount": 1, "to": PAYLOAD, "memo": PAYLOAD})
    pause(db, "xss", text=PAYLOAD, metadata=json.dumps({"title": PAYLOAD, PAYLOAD: 1}),
          APPROVAL_APP_ARGS=args)
    with Served(db) as served:
        for path in ("/inbox", "/sessions", "/sessions/xss"):
            body = call(served.url, path).body
            assert "<script>window" not in body and "<img src=x" not in body, path
            assert html.escape(PAYLOAD) in body or html.escape(
                json.dumps(PAYLOAD, ensure_ascii=False)[1:-1]) in body, path
        session = call(served.url, "/sessions/xss").body
        assert f"<pre class=text>{html.escape(PAYLOAD)}</pre>" in session  # the paused turn
        weird = call(served.url, "/sessions/%3Cscript%3E")
        assert weird.status == 404 and "<script>" not in weird.body


def test_without_an_app_the_pages_are_read_only(tmp_path: Path) -> None:
    db = tmp_path / "agent.db"
    aid = pause(db, "s1")
    with Served(db, app=None) as served:
        inbox = call(served.url, "/inbox")
        assert "read-only" in inbox.body and "class=decide" not in inbox.body
        approval = call(served.url, f"/approvals/{aid}")
        csrf_form = re.search(r'name=csrf value="([0-9a-f]+)"', approval.body)
        assert csrf_form is None
        session = call(served.url, "/sessions/s1")
        token_csrf = csrf_of(call(served.url, "/inbox").body) if "csrf" in inbox.body else None
        assert token_csrf is None and "pay bob" in session.body
        err = served.stop()
    assert "read-only" in err


def test_the_wsgi_callable_mounts_in_another_server(tmp_path: Path) -> None:
    import approval_app

    with SqliteStore(tmp_path / "agent.db") as store:
        agent = approval_app.make_agent(store)
        result = agent.session("w1").send("pay bob")
        assert result.approval_id is not None
        with pytest.raises(ConfigError, match="16 characters"):
            inbox_app(agent, token="short")
        app = inbox_app(agent, token=TOKEN)
        server = make_inbox_server(app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.server_port}/"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            inbox = call(url, "/inbox")
            done = call(url, f"/approvals/{result.approval_id}/decide", method="POST",
                        form={"csrf": csrf_of(inbox.body), "decision": "deny",
                              "reason": "not today"})
            assert done.status == 303
            page = call(url, done.headers["location"])
            assert "outcome: denied by a human: not today" in page.body
            assert call(url, "/nope").status == 404
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=60)


def test_mounted_under_a_path_every_link_stays_under_it(tmp_path: Path) -> None:
    import approval_app

    with SqliteStore(tmp_path / "agent.db") as store:
        agent = approval_app.make_agent(store)
        aid = agent.session("m1").send("pay bob").approval_id
        app = inbox_app(agent, token=TOKEN)
        seen: dict[str, object] = {}

        def start_response(status: str, headers: list[tuple[str, str]]) -> None:
            seen.update(status=status, headers=dict(headers))

        environ = {"REQUEST_METHOD": "GET", "SCRIPT_NAME": "/ops", "PATH_INFO": "/",
                   "QUERY_STRING": f"token={TOKEN}", "wsgi.input": None}
        assert app(environ, start_response) == [b""]
        headers = seen["headers"]
        assert isinstance(headers, dict)
        assert seen["status"] == "303 See Other" and headers["Location"] == "/ops/inbox"
        assert "Path=/ops/" in headers["Set-Cookie"]
        environ.update(PATH_INFO="/inbox", QUERY_STRING="",
                       HTTP_COOKIE=f"{COOKIE}={TOKEN}")
        body = b"".join(app(environ, start_response)).decode()
        assert seen["status"] == "200 OK"
        assert 'src="/ops/static/inbox.js"' in body
        assert f'action="/ops/approvals/{aid}/decide"' in body
        assert 'href="/inbox"' not in body and 'href="/ops/sessions/m1"' in body


def test_serve_prints_a_new_token_when_none_is_given_and_refuses_a_short_one(
    tmp_path: Path
) -> None:
    import subprocess
    import sys

    from _serve import TESTS, WAIT, child_env, read_line

    db = tmp_path / "agent.db"
    pause(db, "s1")
    proc = subprocess.Popen([sys.executable, "-m", "lousho_sync", "serve", "--store", str(db),
                             "--port", "0", "--app", "approval_app:make_agent"], cwd=TESTS,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env())
    try:
        url = read_line(proc).rsplit(" ", 1)[1]
        m = re.fullmatch(r"open (http://127\.0\.0\.1:\d+/)\?token=(\S+) once; the browser "
                         r"keeps the token in a cookie", read_line(proc))
        assert m is not None and m.group(1) == url
        token = m.group(2)
        assert len(token) >= 16 and token != TOKEN
        assert call(url, "/inbox", token=None).status == 401
        assert call(url, "/inbox", token=token).status == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=WAIT)
    short = subprocess.run([sys.executable, "-m", "lousho_sync", "serve", "--store", str(db),
                            "--token", "short"], cwd=TESTS, capture_output=True, text=True,
                           timeout=WAIT, env=child_env())
    assert short.returncode == 2 and "at least 16 characters" in short.stderr


def test_the_inbox_and_the_sessions_page_by_page_and_filter(tmp_path: Path) -> None:
    import approval_app

    with SqliteStore(tmp_path / "agent.db") as store:
        agent = approval_app.make_agent(store)
        ids = [agent.session(sid).send("pay bob").approval_id
               for sid in ("north-1", "north-2", "south-1")]
        for sid in ("north-1", "north-2", "south-1"):
            agent.session(sid).set_metadata({"region": sid.split("-")[0]})
        server = make_inbox_server(inbox_app(agent, token=TOKEN, page_size=2), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.server_port}/"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            def rows(path: str) -> tuple[list[str], str | None]:
                body = call(url, path).body
                found = re.findall(r'data-approval="([0-9a-f]+)"', body)
                more = re.search(r'href="(/inbox\?[^"]+)" rel=next', body)
                return found, html.unescape(more.group(1)) if more else None

            first, older = rows("/inbox")
            assert first == [ids[2], ids[1]] and older is not None
            second, last = rows(older)
            assert second == [ids[0]] and last is None
            north, _ = rows("/inbox?session_prefix=north-")
            assert north == [ids[1], ids[0]]

            sessions = call(url, "/sessions?prefix=north-").body
            assert re.findall(r'<a href="/sessions/([\w-]+)">', sessions) == ["north-2",
                                                                               "north-1"]
            assert "&quot;region&quot;: &quot;north&quot;" in sessions
            page1 = call(url, "/sessions").body
            more = re.search(r'href="(/sessions\?[^"]+)" rel=next', page1)
            assert more is not None
            page2 = call(url, html.unescape(more.group(1))).body
            seen = re.findall(r'<a href="/sessions/([\w-]+)">', page1 + page2)
            assert sorted(seen) == ["north-1", "north-2", "south-1"]
            assert call(url, "/inbox?cursor=bogus").status == 400
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=60)


def _frames(response: http.client.HTTPResponse, until: str) -> list[dict[str, str]]:
    """SSE frames read off a live response, as EventSource parses them, up to and with the
    first of type ``until`` (comments and the retry hint skipped)."""
    frames: list[dict[str, str]] = []
    frame: dict[str, str] = {}
    while True:
        line = response.readline().decode("utf-8")
        assert line, f"the stream ended before {until}: {frames}"
        line = line.rstrip("\n")
        if line == "":
            if "event" in frame:
                frames.append(frame)
                if frame["event"] == until:
                    return frames
            frame = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            frame[field] = value[1:] if value.startswith(" ") else value


def test_the_events_endpoint_needs_the_token_and_streams_a_running_turn_live(
    tmp_path: Path
) -> None:
    from lousho_sync import ScriptedProvider, Step, create_agent

    answer = f"Refund {PAYLOAD} sent."
    first, second = threading.Event(), threading.Event()
    provider = ScriptedProvider([Step(text=answer, chunks=["Refund ", PAYLOAD, " sent."],
                                      gate=first),
                                 Step(text="still answered", gate=second)])
    with SqliteStore(tmp_path / "agent.db") as store:
        agent = create_agent(provider=provider, store=store)
        session = agent.session("live-1")
        server = make_inbox_server(inbox_app(agent, token=TOKEN), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.server_port}/"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            assert call(url, "/sessions/live-1/events").status == 204  # no turn yet
            run = session.start("refund please")
            refused = call(url, "/sessions/live-1/events", token=None)
            assert refused.status == 401 and "needs the token" in refused.body
            page = call(url, "/sessions/live-1")
            m = re.search(r'<div id=live data-events="([^"]+)"', page.body)
            assert m, page.body
            events_path = html.unescape(m.group(1))
            assert events_path == f"/sessions/live-1/events?turn={run.turn_id}"

            conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=60)
            conn.request("GET", events_path, headers={"Authorization": f"Bearer {TOKEN}"})
            r = conn.getresponse()
            assert r.status == 200
            assert r.getheader("Content-Type") == "text/event-stream; charset=utf-8"
            assert r.getheader("Content-Security-Policy") == "default-src 'self'"
            head = _frames(r, until="step.start")  # the model holds its answer: mid-turn
            assert [f["event"] for f in head] == ["run.start", "step.start"]
            first.set()
            rest = _frames(r, until="run.done")
            conn.close()
            deltas = [json.loads(f["data"])["text"] for f in rest if f["event"] == "text.delta"]
            assert "".join(deltas) == answer == run.result(timeout=60).text
            assert all(f["id"].startswith(f"{run.turn_id}:") for f in head + rest)
            assert session.messages[-1].text == answer
            assert "No turn is running." in call(url, "/sessions/live-1").body

            # a browser that leaves mid-turn closes its stream; the turn goes on
            run2 = session.start("and again")
            conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=60)
            conn.request("GET", f"/sessions/live-1/events?turn={run2.turn_id}",
                         headers={"Authorization": f"Bearer {TOKEN}"})
            r = conn.getresponse()
            _frames(r, until="step.start")
            readers = [t for t in threading.enumerate() if t.name == "lousho-sse"]
            assert readers
            conn.close()
            second.set()
            assert run2.result(timeout=60).text == "still answered"
            for reader in readers:
                reader.join(timeout=60)
                assert not reader.is_alive()
            assert [m.text for m in session.messages][-2:] == ["and again", "still answered"]
            bad = call(url, "/sessions/live-1/events", token=TOKEN)
            assert bad.status == 200  # the latest (finished) turn replays to its run.done
            assert "event: run.done" in bad.body
        finally:
            second.set()
            first.set()
            server.shutdown()
            server.server_close()
            thread.join(timeout=60)
