"""The inbox in a real browser: headless Chromium (selenium) against ``lousho serve`` in a
child process on 127.0.0.1, a real SQLite file, turns paused by other processes.

A paused turn is approved from the page and its answer appears there; two browsers decide
the same request at once and the loser's page says who decided; ``<script>`` and
``<img onerror>`` payloads in a message, a tool argument and metadata render as text and
run nothing; a request without the token gets 401 and a POST without the CSRF token 403;
a running turn is shown live on its session page and its text is the committed answer.

Skipped, saying why, when selenium, chromium or chromedriver is missing, unless ``CI`` is
set (then it fails). A failing test leaves each browser's screenshot, page source and console
log under ``tests/browser/artifacts/<test>/`` (ignored by git; CI keeps it) and prints the path.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _serve import Served, pause

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
WAIT = 60.0
PAYLOAD = ('<script>window.__xss = "script"</script>'
           '<img src=x onerror="window.__xss = \'img\'">')
CHROME_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage")


def _missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if _chromium() is None:
        return "chromium is not installed (apt-get install chromium)"
    if _chromedriver() is None:
        return "chromedriver is not installed (apt-get install chromium-driver)"
    return None


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which(
        "google-chrome")


def _chromedriver() -> str | None:
    return shutil.which("chromedriver")


class Browsers:
    """Headless Chromium instances for one test, each with a fresh profile; all closed at
    the end, after their artifacts are saved if the test failed."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.drivers: list[Any] = []

    def open(self) -> Any:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = _chromium() or ""
        profile = self.tmp / f"profile-{len(self.drivers)}"
        for flag in (*CHROME_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(options=options,
                                  service=Service(executable_path=_chromedriver() or ""))
        driver.set_page_load_timeout(WAIT)
        driver.set_script_timeout(WAIT)
        self.drivers.append(driver)
        return driver

    def save(self, name: str) -> Path:
        where = ARTIFACTS / name
        where.mkdir(parents=True, exist_ok=True)
        for n, driver in enumerate(self.drivers):
            try:
                driver.save_screenshot(str(where / f"browser-{n}.png"))
                (where / f"browser-{n}.html").write_text(driver.page_source)
                (where / f"browser-{n}-console.log").write_text(
                    f"url: {driver.current_url}\n" + "\n".join(
                        f"{e.get('level')} {e.get('message')}" for e in console(driver)))
            except Exception as exc:  # a dead browser: say so, keep the others
                (where / f"browser-{n}-error.txt").write_text(repr(exc))
        return where

    def close(self) -> None:
        for driver in self.drivers:
            try:
                driver.quit()
            except Exception:
                pass


_console_seen: dict[int, list[dict[str, Any]]] = {}


def console(driver: Any) -> list[dict[str, Any]]:
    """Every console entry of ``driver`` so far (get_log drains; kept here)."""
    kept = _console_seen.setdefault(id(driver), [])
    kept += driver.get_log("browser")
    return list(kept)


@pytest.fixture
def browsers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Browsers]:
    reason = _missing()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"CI is set but the browser tests cannot run: {reason}")
        pytest.skip(reason)
    failed_before = request.session.testsfailed
    b = Browsers(tmp_path)
    try:
        yield b
    finally:
        if request.session.testsfailed > failed_before and b.drivers:
            where = b.save(request.node.name)
            print(f"browser artifacts (screenshots, pages, console logs): {where}",
                  file=sys.stderr)
        b.close()


def wait_for(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT).until(condition, message=f"waited for {what}")


def enter(driver: Any, served: Served, path: str = "/") -> None:
    """Open ``path`` with the token once, as an operator does with the printed URL."""
    driver.get(f"{served.url.rstrip('/')}{path}?token={served.token}")
    wait_for(driver, lambda d: d.execute_script(
        "return document.documentElement.getAttribute('data-inbox-ready')") == "1",
        "the inbox script to run")


def test_a_paused_turn_is_approved_from_the_page_and_its_answer_appears(
    browsers: Browsers, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    db = tmp_path / "agent.db"
    aid = pause(db, "acct-7")
    with Served(db) as served:
        driver = browsers.open()
        enter(driver, served)
        assert driver.current_url == served.url + "inbox"  # the token left the URL
        cookie = driver.get_cookie("lousho_inbox")
        assert cookie is not None and cookie["httpOnly"] is True
        assert cookie["sameSite"] == "Strict"
        assert driver.execute_script("return document.cookie") == ""  # not readable by JS
        row = driver.find_element(By.ID, f"approval-{aid}")
        assert row.find_element(By.CSS_SELECTOR, "a.tool").text == "pay"
        assert json.loads(row.find_element(By.CSS_SELECTOR, "pre.arguments").text) == {
            "amount": 5, "to": "bob"}
        driver.find_element(By.ID, "operator").send_keys("alice")
        row.find_element(By.NAME, "reason").send_keys("known payee")
        row.find_element(By.CSS_SELECTOR, "button.approve").click()
        wait_for(driver, lambda d: "/sessions/acct-7" in d.current_url, "the session page")
        notice = driver.find_element(By.ID, "decided").text
        assert notice == "pay approved by alice: known payee; the turn went on."
        texts = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "ol.transcript pre.text")]
        assert texts == ["pay bob", "paid 5 to bob", "outcome: paid 5 to bob"]
        assert driver.find_element(By.ID, "pending").text == "None."
        driver.get(served.url + "inbox")
        assert "No approval is waiting." in driver.find_element(By.TAG_NAME, "main").text
        assert driver.find_element(By.ID, "operator").get_attribute("value") == "alice"


def test_two_browsers_decide_at_once_one_wins_and_the_other_says_who(
    browsers: Browsers, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    db = tmp_path / "agent.db"
    aid = pause(db, "acct-9")
    with Served(db) as served:
        pages = {"alice": browsers.open(), "bob": browsers.open()}
        for name, driver in pages.items():
            enter(driver, served)
            driver.find_element(By.ID, "operator").send_keys(name)
        barrier = threading.Barrier(len(pages))
        errors: list[BaseException] = []

        def click(driver: Any, button: str) -> None:
            try:
                target = driver.find_element(By.CSS_SELECTOR,
                                             f"#approval-{aid} button.{button}")
                barrier.wait(timeout=WAIT)
                target.click()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=click, args=(d, b))
                   for d, b in zip(pages.values(), ("approve", "deny"), strict=True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=WAIT)
        assert errors == []
        outcome: dict[str, str] = {}
        for name, driver in pages.items():
            wait_for(driver, lambda d: "/sessions/" in d.current_url
                     or d.find_elements(By.ID, "outcome"), f"{name}'s answer")
            outcome[name] = "won" if "/sessions/" in driver.current_url else "lost"
        assert sorted(outcome.values()) == ["lost", "won"], outcome
        winner = next(n for n, o in outcome.items() if o == "won")
        loser = next(n for n, o in outcome.items() if o == "lost")
        decision = "approved" if winner == "alice" else "denied"
        told = pages[loser].find_element(By.ID, "outcome").text
        assert told.startswith(f"Already {decision} by {winner} at ")
        assert pages[loser].find_element(By.CSS_SELECTOR, "strong.decider").text == winner
        answer = pages[winner].find_elements(By.CSS_SELECTOR, "ol.transcript pre.text")[-1].text
        assert answer == ("outcome: paid 5 to bob" if winner == "alice"
                          else "outcome: denied by a human")


def test_payloads_in_a_message_an_argument_and_metadata_render_as_text_and_run_nothing(
    browsers: Browsers, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    db = tmp_path / "agent.db"
    pause(db, "xss-1", text=PAYLOAD, metadata=json.dumps({"title": PAYLOAD}),
          APPROVAL_APP_ARGS=json.dumps({"amount": 1, "to": PAYLOAD}))
    with Served(db) as served:
        driver = browsers.open()
        enter(driver, served)
        args = json.loads(driver.find_element(By.CSS_SELECTOR, "pre.arguments").text)
        assert args == {"amount": 1, "to": PAYLOAD}
        driver.get(served.url + "sessions/xss-1")
        assert PAYLOAD in [e.text for e in driver.find_elements(By.CSS_SELECTOR, "pre.text")]
        meta = driver.find_element(By.CSS_SELECTOR, "table.metadata pre").text
        assert json.loads(meta) == PAYLOAD
        driver.get(served.url + "sessions")
        listed = json.loads(driver.find_element(By.CSS_SELECTOR, "pre.metadata").text)
        assert listed == {"title": PAYLOAD}
        for path in ("inbox", "sessions/xss-1", "sessions"):
            driver.get(served.url + path)
            assert driver.execute_script("return window.__xss === undefined"), path
            assert driver.find_elements(By.CSS_SELECTOR, "main script, main img") == [], path
        problems = [e for e in console(driver)
                    if e.get("level") == "SEVERE" or "Content Security Policy" in e.get(
                        "message", "")]
        assert problems == []


def test_no_token_is_401_and_a_post_without_the_csrf_token_is_403(
    browsers: Browsers, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    db = tmp_path / "agent.db"
    aid = pause(db, "acct-3")
    with Served(db) as served:
        stranger = browsers.open()
        stranger.get(served.url + "inbox")
        assert "needs the token" in stranger.find_element(By.TAG_NAME, "main").text
        assert stranger.find_elements(By.CSS_SELECTOR, "form.decide") == []
        status = stranger.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch('/inbox').then(r => done(r.status), e => done(String(e)));")
        assert status == 401

        operator = browsers.open()
        enter(operator, served)
        fetched = operator.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            f"fetch('/approvals/{aid}/decide', {{method: 'POST', headers: {{'Content-Type':"
            " 'application/x-www-form-urlencoded'}, body: 'decision=approve'})"
            ".then(r => done(r.status), e => done(String(e)));")
        assert fetched == 403
        operator.execute_script(  # the real form, its CSRF field taken out
            "document.querySelector('form.decide input[name=csrf]').remove();")
        operator.find_element(By.CSS_SELECTOR, f"#approval-{aid} button.approve").click()
        wait_for(operator, lambda d: "Refused" in d.title, "the refusal")
        assert "missing its CSRF token" in operator.find_element(By.TAG_NAME, "main").text
        operator.get(served.url + "inbox")
        assert operator.find_elements(By.ID, f"approval-{aid}") != []  # still waiting


class _InProcess:
    """The inbox app served from a thread of this process (``url`` ends with "/")."""

    def __init__(self, app: Any) -> None:
        from _serve import TOKEN

        from lousho_sync.inbox import make_inbox_server

        self.token = TOKEN
        self.server = make_inbox_server(app, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=WAIT)


def test_a_running_turn_is_shown_live_and_its_text_is_the_committed_answer(
    browsers: Browsers, tmp_path: Path
) -> None:
    from _serve import TOKEN
    from selenium.webdriver.common.by import By

    from lousho_sync import ScriptedProvider, Step, create_agent
    from lousho_sync.inbox import inbox_app
    from lousho_sync.sqlite import SqliteStore

    gate = threading.Event()
    answer = f"Found it: {PAYLOAD}\nline two."
    provider = ScriptedProvider([Step(text=answer, chunks=["Found it: ", PAYLOAD, "\nline",
                                                           " two."], gate=gate)])
    with SqliteStore(tmp_path / "agent.db") as store:
        agent = create_agent(provider=provider, store=store)
        session = agent.session("live-7")
        served = _InProcess(inbox_app(agent, token=TOKEN))
        try:
            run = session.start("find it")  # a turn of the session, driven in a thread
            driver = browsers.open()
            enter(driver, served, "/sessions/live-7")  # type: ignore[arg-type]
            wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#live-steps li"),
                     "the running turn's first step")  # the model holds its answer
            assert driver.find_element(By.ID, "live-state").text == "Running…"
            gate.set()
            wait_for(driver, lambda d: d.find_element(By.ID, "live").get_attribute(
                "data-done"), "the end of the turn")
            committed = run.result(timeout=WAIT).text
            assert committed == answer == session.messages[-1].text
            shown = driver.execute_script(
                "return document.querySelector('#live-steps pre.text').textContent")
            assert shown == committed
            assert driver.find_element(By.ID, "live-state").text.startswith(
                "The turn ended (stop).")
            assert driver.execute_script("return window.__xss === undefined")
            assert driver.find_elements(By.CSS_SELECTOR, "main script, main img") == []
            problems = [e for e in console(driver)
                        if e.get("level") == "SEVERE" or "Content Security Policy" in e.get(
                            "message", "")]
            assert problems == []
            driver.refresh()  # the turn ended: the page says so and the answer is committed
            assert driver.find_element(By.ID, "live").text == "No turn is running."
            texts = [e.text for e in driver.find_elements(By.CSS_SELECTOR,
                                                          "ol.transcript pre.text")]
            assert texts[-1] == answer
        finally:
            gate.set()
            served.stop()
