"""``sandbox.ports``, on asyncio: TCP servers in the sandbox reached from this host. ``url`` is
serve's HTTP proxy to a guest port (service mode); ``forward`` a local TCP port bridged to it in
either mode (_forward.py, on threads of its own). A sandbox's forwards are closed when it is
killed or paused."""
from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Dict, Set

from . import _validate as valid
from ._forward import Forwarder

if TYPE_CHECKING:  # pragma: no cover
    from ._lifecycle import AsyncSandbox


async def close_forwarder(forwarder: Forwarder) -> None:
    """Closes ``forwarder`` without blocking the event loop: its acceptor thread ends the
    connections and says when it is done."""
    loop = asyncio.get_running_loop()
    done: "asyncio.Future[None]" = loop.create_future()

    def finished() -> None:
        if not done.done():
            done.set_result(None)

    def notify() -> None:
        try:
            loop.call_soon_threadsafe(finished)
        except RuntimeError:
            pass  # the loop is closed: nobody waits

    forwarder.on_closed(notify)
    forwarder.begin_close()
    await asyncio.shield(done)
    forwarder.join()  # past its last step: returns at once


class AsyncPortForward:
    """A local TCP listener at ``address`` (``host:port``; ``[host]:port`` for IPv6) whose every
    connection is bridged to ``guest_port`` in the sandbox, bytes unchanged both ways, until
    :meth:`close` (or the end of an ``async with`` block, or the sandbox's kill or pause). A
    connection the sandbox refuses (nothing listens on the guest port, the sandbox has ended) is
    closed, and why is logged on the ``agentvm.ports`` logger."""

    def __init__(self, forwarder: Forwarder) -> None:
        self._forwarder = forwarder

    @property
    def host(self) -> str:
        """The local address listened on (``127.0.0.1`` by default)."""
        return self._forwarder.host

    @property
    def port(self) -> int:
        """The local port listened on (the one the system chose for ``port=0``)."""
        return self._forwarder.port

    @property
    def address(self) -> str:
        return self._forwarder.address

    @property
    def guest_port(self) -> int:
        return self._forwarder.guest_port

    @property
    def closed(self) -> bool:
        return self._forwarder.closing

    async def close(self) -> None:
        """Stops listening and ends every connection; returns once the forward's threads and
        sockets are gone. Closing twice is fine."""
        await close_forwarder(self._forwarder)

    async def __aenter__(self) -> AsyncPortForward:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncPortForward({self.address!r} -> guest port {self.guest_port}{', closed' if self.closed else ''})"


class AsyncPorts:
    """``sandbox.ports``: see :meth:`url` and :meth:`forward`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox
        self._lock = threading.Lock()  # forwards are closed on their own threads too
        self._forwards: Set[Forwarder] = set()

    def url(self, port: int) -> str:
        """Service mode: the HTTP URL of guest port ``port`` through serve,
        ``{url}/v1/sandboxes/{id}/ports/{port}/``. Requests to it need serve's token as the
        native API does: send :meth:`headers` with them. A serve on a Unix socket has no URL
        (ValueError), nor has an embedded sandbox: use :meth:`forward` there."""
        p = valid.port("port", port)
        return self._sb._transport.port_url(p)

    def headers(self) -> Dict[str, str]:
        """The headers a request to :meth:`url` needs: ``{"Authorization": "Bearer TOKEN"}``
        with a token, else ``{}`` (also in embedded mode)."""
        return self._sb._transport.port_headers()

    async def forward(self, guest_port: int, *, host: str = "127.0.0.1", port: int = 0) -> AsyncPortForward:
        """A local TCP listener on ``host:port`` (``port=0``: a free one; see the answer's
        ``port``) whose every connection is bridged to ``guest_port`` in the sandbox, bytes
        unchanged both ways; an end of stream either way is passed on as a half-close. Either
        mode: embedded through the episode's vsock socket, service through an upgraded
        connection to serve (``http://`` or ``unix:``, not ``https://``). The listener is open
        when this returns (``OSError`` when it cannot be); the sandbox is asked for the guest
        port at each connection, which is closed (and logged) when it refuses."""
        gp = valid.port("guest_port", guest_port)
        valid.text("host", host)
        lp = valid.port("port", port, low=0)
        self._sb._check_alive()
        dialer = self._sb._transport.port_dialer()
        forwarder = Forwarder(dialer, gp, host, lp, sandbox_id=self._sb.sandbox_id)
        with self._lock:
            self._forwards.add(forwarder)

        def forget() -> None:
            with self._lock:
                self._forwards.discard(forwarder)

        forwarder.on_closed(forget)
        return AsyncPortForward(forwarder)

    async def _close_all(self) -> None:
        """Every forward of the sandbox closed (its kill or pause)."""
        with self._lock:
            forwarders = list(self._forwards)
        if forwarders:
            await asyncio.gather(*(close_forwarder(f) for f in forwarders))
