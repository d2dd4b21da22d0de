"""Egress with a real guest (python/README.md, "Egress"), both transports: ``egress=`` on
create lets the sandbox's commands reach a web server of the test's on 127.0.0.2 through the
proxy they find in HTTP_PROXY (embedded: ``agentvm episode --egress-allow``; service: the
create's ``egress`` field), refuses what the rules do not name with the proxy's reason, and a
sandbox created without it has no proxy at all. Bad rules are named before anything starts."""
from __future__ import annotations

import http.server
import threading
from typing import Any, Dict, Iterator

import pytest

from agentvm import Sandbox


class Hello(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = f"outside saw {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def outside() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.2:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_egress_allows_what_its_rules_name(target: Dict[str, Any], outside: str) -> None:
    with Sandbox(**target, egress={"allow": ["127.0.0.2"]}) as sb:
        r = sb.commands.run(f"curl -sS {outside}/pkg")
        assert (r.exit_code, r.stdout) == (0, "outside saw /pkg"), r
        r = sb.commands.run(f"python3 -c 'import urllib.request as u; print(u.urlopen(\"{outside}/py\").read().decode())'")
        assert r.stdout == "outside saw /py\n", r
    with Sandbox(**target, egress={"allow": ["*"], "deny": ["8.8.8.8"]}) as sb:
        r = sb.commands.run(f"curl -sS {outside}/x")
        assert r.stdout.startswith("agentvm egress: ") and "loopback" in r.stdout, r


def test_without_egress_there_is_no_proxy(target: Dict[str, Any], outside: str) -> None:
    with Sandbox(**target) as sb:
        assert sb.commands.run("printenv HTTP_PROXY || echo unset").stdout == "unset\n"
        assert sb.commands.run(f"curl -sS -m 20 {outside}/x").exit_code != 0


def test_bad_egress_is_named(target: Dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unknown key"):
        Sandbox(**target, egress={"permit": ["x"]})
    with pytest.raises(TypeError, match="list of rule strings"):
        Sandbox(**target, egress={"allow": "pypi.org"})
    with pytest.raises(Exception, match="a..b"):
        Sandbox(**target, egress={"allow": ["a..b"]})
