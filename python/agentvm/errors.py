"""The exceptions of the agentvm client.

Every error carries the protocol's error ``code`` (docs/protocol.md, "Errors" and "When the
episode fails"; docs/api.md, "Errors") and its human ``message``. Programs should branch on the
class or on ``code``, never on the message.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    from .models import CommandResult

__all__ = [
    "AgentvmError",
    "AgentError",
    "NotFound",
    "SandboxDied",
    "SandboxLost",
    "StartFailed",
    "ServiceError",
    "Timeout",
    "CallTimeout",
    "CommandFailed",
    "BinaryNotFound",
    "SANDBOX_DEATH_CODES",
]

# Codes with which an episode answers the calls it could not finish because its VM ended.
SANDBOX_DEATH_CODES = frozenset({"vm_died", "agent_died", "watchdog", "stopped", "episode_timeout"})


class AgentvmError(Exception):
    """Base class: ``code`` is the protocol's error code, ``message`` says why.

    ``status`` is the HTTP status when the error came from ``agentvm serve``, else None.
    """

    def __init__(self, code: str, message: str, *, status: Optional[int] = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


class AgentError(AgentvmError):
    """The guest agent (or the episode's check of a request) refused or could not do a call:
    ``not_found``, ``spawn_failed``, ``io``, ``bad_field``, ``missing_field``, ``unknown_op``,
    ``bad_json``, ``line_too_long``, ``internal``; of processes ``exists`` (a running one has the
    tag), ``limit`` (too many processes, attachments or unread stdin) and ``stdin_closed``; of
    files ``exists`` (``make_dir``: something else in the way), ``not_empty`` and ``limit`` (too
    many watches, or a tree too big to watch). The sandbox goes on."""


class NotFound(AgentError):
    """``not_found``: no such command, working directory or file."""


class SandboxDied(AgentvmError):
    """The sandbox ended under the call, or had ended before it: ``vm_died``, ``agent_died``,
    ``watchdog``, ``stopped``, ``episode_timeout``; ``killed`` after :meth:`kill`; ``exited``
    when the episode process ended otherwise. In service mode, a sandbox the service no longer
    has gives the reason serve names (``deleted``, ``timeout``, ``idle_timeout``, ``vm_died``).

    ``exit_status`` is the ``agentvm episode`` process's exit status (embedded mode) and
    ``stderr_tail`` the end of its stderr, when known."""

    def __init__(self, code: str, message: str, *, status: Optional[int] = None,
                 exit_status: Optional[int] = None, stderr_tail: str = "") -> None:
        super().__init__(code, message, status=status)
        self.exit_status = exit_status
        self.stderr_tail = stderr_tail


class SandboxLost(SandboxDied):
    """``sandbox_lost`` (HTTP 410 from ``agentvm serve``): the sandbox's node is gone, or its
    serve was restarted, so the sandbox is lost with it (docs/fleet.md). Nothing the sandbox's
    code did caused it: a trainer counts it as an infrastructure failure, not a wrong answer,
    and may run the episode again in a new sandbox. ``node`` is the node that held it, when
    serve names it. A :class:`SandboxDied`: the sandbox is as gone as one whose VM died."""

    def __init__(self, code: str, message: str, *, status: Optional[int] = None,
                 node: Optional[str] = None) -> None:
        super().__init__(code, message, status=status)
        self.node = node


class StartFailed(AgentvmError):
    """``start_failed``: the sandbox's VM did not start (the message has agentvm's reason)."""


class ServiceError(AgentvmError):
    """``agentvm serve`` refused a request (``status`` is the HTTP status, ``code`` serve's
    error, e.g. 429 ``at_capacity``); ``retry_after`` is its ``Retry-After`` in seconds, if any."""

    def __init__(self, code: str, message: str, *, status: Optional[int] = None,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(code, message, status=status)
        self.retry_after = retry_after


class Timeout(AgentvmError, TimeoutError):
    """A client-side deadline passed before the answer came (``code`` ``client_timeout``)."""

    def __init__(self, message: str) -> None:
        super().__init__("client_timeout", message)


class CallTimeout(Timeout):
    """A call's answer did not arrive within its client deadline (its ``timeout`` plus the
    grace, or ``request_timeout``); the call was cancelled in the sandbox."""


class CommandFailed(AgentvmError):
    """``check=True`` and the command did not exit 0; ``result`` is its :class:`CommandResult`."""

    def __init__(self, result: "CommandResult", what: str = "the command") -> None:
        if result.timed_out:
            how = "timed out"
        elif result.signal is not None:
            how = f"was killed by signal {result.signal}"
        else:
            how = f"exited {result.exit_code}"
        tail = result.stderr[-2000:].strip()
        super().__init__("command_failed", f"{what} {how}" + (f": {tail}" if tail else ""))
        self.result = result


class BinaryNotFound(AgentvmError, FileNotFoundError):
    """Embedded mode could not find the ``agentvm`` binary; ``looked`` lists where it looked."""

    def __init__(self, looked: "list[str]") -> None:
        super().__init__("binary_not_found",
                         "no agentvm binary found; looked at: " + "; ".join(looked)
                         + " (set AGENTVM_BIN, put agentvm in PATH, or build the checkout)")
        self.looked = looked


def error_from_protocol(code: str, message: str, *, status: Optional[int] = None) -> AgentvmError:
    """The exception for a protocol error object ``{"code":…, "message":…}``."""
    if code == "sandbox_lost":
        return SandboxLost(code, message, status=status)
    if code in SANDBOX_DEATH_CODES:
        return SandboxDied(code, message, status=status)
    if code == "not_found":
        return NotFound(code, message, status=status)
    if code == "start_failed":
        return StartFailed(code, message, status=status)
    return AgentError(code, message, status=status)
