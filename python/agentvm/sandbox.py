"""Sandboxes: ``AsyncSandbox`` (the implementation, on asyncio) and ``Sandbox`` (the same API,
blocking, run on the package's one background event-loop thread).

The names of this module, where they have always been importable from; they live in
_lifecycle.py (AsyncSandbox), _commands.py, _files.py (with _watch.py), _contexts.py,
_ports.py (with _forward.py) and _sync.py (the blocking API), over the transports of
_episode.py (embedded) and _http.py (service).
"""
from __future__ import annotations

from ._commands import AsyncCommandHandle as AsyncCommandHandle
from ._commands import AsyncCommands as AsyncCommands
from ._commands import Output as Output
from ._common import DEFAULT_START_TIMEOUT as DEFAULT_START_TIMEOUT
from ._files import AsyncFiles as AsyncFiles
from ._files import Data as Data
from ._files import EntryList as EntryList
from ._lifecycle import AsyncSandbox as AsyncSandbox
from ._processes import AsyncProcess as AsyncProcess
from ._processes import AsyncProcessCommands as AsyncProcessCommands
from ._ports import AsyncPortForward as AsyncPortForward
from ._ports import AsyncPorts as AsyncPorts
from ._processes import AsyncPty as AsyncPty
from ._sync import CommandHandle as CommandHandle
from ._sync import Commands as Commands
from ._sync import Files as Files
from ._sync import PortForward as PortForward
from ._sync import Ports as Ports
from ._sync import Process as Process
from ._sync import ProcessCommands as ProcessCommands
from ._sync import Pty as Pty
from ._sync import Sandbox as Sandbox
from ._sync import WatchHandle as WatchHandle
from ._validate import MAX_FORK_COUNT as MAX_FORK_COUNT
from ._watch import AsyncWatchHandle as AsyncWatchHandle
from ._validate import MAX_SANDBOX_TIMEOUT as MAX_SANDBOX_TIMEOUT

__all__ = ["AsyncSandbox", "Sandbox", "AsyncCommandHandle", "CommandHandle", "EntryList", "AsyncProcess", "Process",
           "AsyncPty", "Pty", "AsyncWatchHandle", "WatchHandle", "AsyncPortForward", "PortForward"]
