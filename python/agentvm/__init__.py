"""agentvm: the Python client of agentvm's microVM sandboxes.

``Sandbox`` / ``AsyncSandbox`` run commands, code and file transfers in a fresh VM, either
embedded (an ``agentvm episode`` subprocess on this host) or through ``agentvm serve``
(``url=`` or ``$AGENTVM_URL``). See python/README.md.
"""
from __future__ import annotations

from .errors import (AgentError, AgentvmError, BinaryNotFound, CallTimeout, CommandFailed, NotFound,
                     SandboxDied, SandboxLost, ServiceError, StartFailed, Timeout)
from .models import (CodeContext, CommandResult, EntryInfo, Execution, ExecutionError, FileInfo, FilesystemEvent,
                     ProcessInfo, ProcessResult)
from ._commands import AsyncCommandHandle
from ._files import EntryList
from ._http import SandboxList
from ._lifecycle import AsyncSandbox
from ._ports import AsyncPortForward
from ._processes import AsyncProcess, AsyncPty
from ._sync import CommandHandle, PortForward, Process, Pty, Sandbox, WatchHandle
from ._watch import AsyncWatchHandle

__version__ = "0.1.0"

__all__ = [
    "Sandbox", "AsyncSandbox", "CommandHandle", "AsyncCommandHandle",
    "CommandResult", "Execution", "ExecutionError", "FileInfo", "EntryInfo", "EntryList", "SandboxList",
    "Process", "AsyncProcess", "Pty", "AsyncPty", "ProcessResult", "ProcessInfo",
    "WatchHandle", "AsyncWatchHandle", "FilesystemEvent", "CodeContext", "PortForward", "AsyncPortForward",
    "AgentvmError", "AgentError", "NotFound", "SandboxDied", "SandboxLost", "StartFailed", "ServiceError",
    "Timeout", "CallTimeout", "CommandFailed", "BinaryNotFound",
]
