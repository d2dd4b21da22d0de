"""The client's side of a fleet (docs/fleet.md), against a tiny local HTTP server that answers
as serve does, no guest: a sandbox whose node is gone raises ``SandboxLost`` (410
``sandbox_lost``, with the node), again on every later call, and ``Sandbox.list`` gives the
sandboxes with the nodes that did not answer in ``unreached_nodes``."""
from __future__ import annotations

import asyncio
import http.server
import json
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import agentvm
from agentvm import AsyncSandbox, Sandbox, SandboxDied, SandboxList, SandboxLost, ServiceError

pytestmark = pytest.mark.no_guest

LOST_ID = "n2-0a1b2c-0123456789abcdef"
TOKEN = "fleet-client-token"


class FakeServe(http.server.ThreadingHTTPServer):
    """Answers: a create with a sandbox of node n2, every later request about it with 410
    sandbox_lost naming n2, and GET /v1/sandboxes with ``list_answer``."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.list_answer: Tuple[int, Dict[str, str], Any] = (200, {}, {"sandboxes": []})
        self.seen: List[Tuple[str, str, Optional[str]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    server: FakeServe
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def answer(self, status: int, doc: Any, headers: Optional[Dict[str, str]] = None) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        if self.command == "POST" and self.path == "/v1/sandboxes":
            return self.answer(201, {"id": LOST_ID, "state": "running", "pid": 1, "restored": True})
        if self.command == "GET" and self.path == "/v1/sandboxes":
            status, headers, doc = self.server.list_answer
            return self.answer(status, doc, headers)
        if self.path.startswith(f"/v1/sandboxes/{LOST_ID}"):
            return self.answer(410, {"error": "sandbox_lost", "node": "n2",
                                     "message": f"sandbox {LOST_ID} was lost: its node n2 is gone"})
        self.answer(404, {"error": "not_found", "message": f"no such endpoint: {self.path}"})

    do_GET = do_POST = do_DELETE = do_PUT = handle_any


@pytest.fixture
def fake() -> Iterator[FakeServe]:
    server = FakeServe()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_sandbox_lost_is_raised_with_its_node(fake: FakeServe) -> None:
    sb = Sandbox(url=fake.url, token=TOKEN)
    assert sb.sandbox_id == LOST_ID
    with pytest.raises(SandboxLost) as caught:
        sb.commands.run("echo hi")
    err = caught.value
    assert err.code == "sandbox_lost"
    assert err.status == 410
    assert err.node == "n2"
    assert "n2 is gone" in err.message
    # A lost sandbox is gone: SandboxDied catches it, and so does the infrastructure check.
    assert isinstance(err, SandboxDied) and isinstance(err, agentvm.AgentvmError)
    assert not isinstance(err, ServiceError)
    calls = len(fake.seen)
    with pytest.raises(SandboxLost) as again:
        sb.run_code("1 + 1")
    assert again.value.node == "n2"
    assert len(fake.seen) == calls, "a call on a lost sandbox went to serve again"
    assert not sb.is_running()
    sb.kill()  # quiet: the sandbox is gone already


def test_sandbox_lost_async(fake: FakeServe) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.create(url=fake.url, token=TOKEN)
        with pytest.raises(SandboxLost) as caught:
            await sb.files.write("/tmp/x", "y")
        assert caught.value.node == "n2"
        await sb.kill()

    asyncio.run(main())


def test_sandbox_lost_without_a_node_in_the_body() -> None:
    err = agentvm.errors.error_from_protocol("sandbox_lost", "lost")
    assert isinstance(err, SandboxLost) and err.node is None


def test_list_names_the_unreached_nodes(fake: FakeServe) -> None:
    sandboxes = [{"id": "n1-0a1b2c-0000000000000001", "state": "running"},
                 {"id": "n2-0a1b2c-0000000000000002", "state": "paused"}]
    fake.list_answer = (200, {"Agentvm-Unreached-Nodes": "n3 (could not connect)"},
                        {"sandboxes": sandboxes, "unreached": [{"node": "n3", "problem": "could not connect"}]})
    listed = Sandbox.list(url=fake.url, token=TOKEN)
    assert isinstance(listed, SandboxList) and isinstance(listed, list)
    assert [s["id"] for s in listed] == [s["id"] for s in sandboxes]
    assert listed.unreached_nodes == {"n3": "could not connect"}
    assert fake.seen[-1] == ("GET", "/v1/sandboxes", f"Bearer {TOKEN}")

    # The header alone (a body without "unreached") says the same.
    fake.list_answer = (200, {"Agentvm-Unreached-Nodes": "n3 (could not connect); n4 (no whole answer within 5 s)"},
                        {"sandboxes": sandboxes})
    assert Sandbox.list(url=fake.url, token=TOKEN).unreached_nodes == {
        "n3": "could not connect", "n4": "no whole answer within 5 s"}

    # A lone serve: nothing unreached.
    fake.list_answer = (200, {}, {"sandboxes": []})
    listed = Sandbox.list(url=fake.url, token=TOKEN)
    assert listed == [] and listed.unreached_nodes == {}


def test_list_async_and_errors(fake: FakeServe, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        fake.list_answer = (200, {}, {"sandboxes": [{"id": "n1-0a1b2c-0000000000000001"}], "unreached": []})
        monkeypatch.setenv("AGENTVM_URL", fake.url)
        listed = await AsyncSandbox.list()
        assert len(listed) == 1 and listed.unreached_nodes == {}
        fake.list_answer = (401, {}, {"error": "unauthorized", "message": "a valid token is required"})
        with pytest.raises(ServiceError) as caught:
            await AsyncSandbox.list(token="wrong")
        assert caught.value.code == "unauthorized" and caught.value.status == 401
        monkeypatch.delenv("AGENTVM_URL")
        with pytest.raises(ValueError):
            await AsyncSandbox.list()

    asyncio.run(main())
