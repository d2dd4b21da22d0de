"""``AsyncSandbox``: a sandbox on asyncio, from its creation (which picks the transport: the
only place that knows embedded from service mode) through fork and pause to its end. Its
commands, files and code cells are _commands.py's and _files.py's."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import _loop
from . import _validate as valid
from ._binary import find_agentvm
from . import _contexts as contexts
from ._commands import AsyncCommands, OnDisplay, Output, run_code
from ._common import DEFAULT_GRACE, DEFAULT_START_TIMEOUT, MAX_CALL_TIMEOUT, Transport
from ._contexts import ContextRef
from ._episode import EpisodeTransport
from ._files import AsyncFiles
from ._http import HttpClient, SandboxList, ServiceTransport, list_sandboxes
from ._ports import AsyncPorts
from ._processes import AsyncPty, attachments_suspended, paused_error
from ._validate import MAX_FORK_COUNT, MAX_SANDBOX_TIMEOUT
from ._watch import watches_suspended
from .errors import SandboxDied
from .models import CodeContext, Execution


class AsyncSandbox:
    """A sandbox, on asyncio: ``sb = await AsyncSandbox.create(...)``; see the README."""

    def __init__(self, transport: Transport, *, envs: Dict[str, str], metadata: Dict[str, str],
                 timeout: float) -> None:
        self._transport = transport
        self.mode = transport.kind
        self.envs = envs
        self.metadata = metadata
        self.timeout = timeout
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)
        self.pty = AsyncPty(self)
        self.ports = AsyncPorts(self)
        self._killed = False
        self._paused = False

    @classmethod
    async def create(cls, snapshot: Optional[str] = None, timeout: float = 300,
                     envs: Optional[Mapping[str, str]] = None, metadata: Optional[Mapping[str, str]] = None,
                     url: Optional[str] = None, token: Optional[str] = None, pool: Optional[str] = None, *,
                     binary: Optional[str] = None, start_timeout: float = DEFAULT_START_TIMEOUT,
                     grace: float = DEFAULT_GRACE, agentvm_args: Sequence[str] = (),
                     template: Optional[str] = None, snapshot_dir: Optional[str] = None,
                     egress: Optional[Mapping[str, Sequence[str]]] = None) -> AsyncSandbox:
        """A new sandbox. Service mode when ``url`` (or ``$AGENTVM_URL``) names a server
        (``unix:/path`` or ``http://host:port``), else embedded (an ``agentvm episode``
        subprocess restored from the default snapshot, or ``snapshot``). ``template`` names an
        ``agentvm template`` in either mode: embedded, the episode runs it; a service serves it
        as the pool of that name (``agentvm serve --pool NAME=N``). ``snapshot_dir`` (embedded):
        an existing directory where :meth:`fork` and :meth:`pause` write live snapshots, which
        the caller removes when done with them; without it they go to a directory the client
        keeps and removes once no sandbox of this one's lineage runs and none of its paused
        snapshots waits to be resumed (python/README.md, "Fork, pause and resume"). ``egress``:
        ``{"allow": [rules], "deny": [rules]}``, where the sandbox may connect out through the
        proxy its commands find in ``HTTP_PROXY`` (docs/api.md, "Egress"); by default nowhere
        (a service's own default, embedded)."""
        t = valid.number("timeout", timeout, low=1, high=MAX_SANDBOX_TIMEOUT, low_inclusive=True)
        rules = valid.egress(egress)
        env = valid.envs("envs", envs)
        meta = valid.metadata(metadata)
        st = valid.number("start_timeout", start_timeout, low=0, high=MAX_CALL_TIMEOUT)
        g = valid.number("grace", grace, low=0, high=MAX_CALL_TIMEOUT)
        if template is not None:
            valid.text("template", template)
            if snapshot is not None:
                raise ValueError("template and snapshot both name what to run: give one")
            if pool is not None and pool != template:
                raise ValueError("template and pool both name the service's pool: give one")
        if url is None:
            url = os.environ.get("AGENTVM_URL") or None
        transport: Transport
        if url is not None:
            if template is not None:
                pool = template
            valid.text("url", url)
            if snapshot is not None:
                raise ValueError("snapshot is for embedded mode; a service names its snapshots as pools (pool=)")
            if binary is not None or agentvm_args or snapshot_dir is not None:
                raise ValueError("binary, agentvm_args and snapshot_dir are for embedded mode")
            if token is None:
                token = os.environ.get("AGENTVM_TOKEN") or None
            if token is not None:
                valid.text("token", token)
            if pool is not None:
                valid.text("pool", pool)
            body: Dict[str, Any] = {"timeout": t if t != int(t) else int(t)}
            if env:
                body["env"] = env
            if meta:
                body["metadata"] = meta
            if pool is not None:
                body["pool"] = pool
            if rules is not None:
                body["egress"] = rules
            transport = await ServiceTransport.create(HttpClient.get(url, token), body, grace=g, start_timeout=st)
        else:
            if pool is not None:
                raise ValueError("pool is for service mode (url= or AGENTVM_URL); embedded mode takes snapshot=")
            if token is not None:
                raise ValueError("token is for service mode (url= or AGENTVM_URL)")
            if snapshot is not None:
                snapshot = valid.text("snapshot", os.fspath(snapshot))
            user_args = [valid.text("agentvm_args item", a) for a in agentvm_args]
            for key in ("allow", "deny"):
                for rule in (rules or {}).get(key, []):
                    user_args += [f"--egress-{key}", rule]
            args = (["--template", template] if template is not None else []) + user_args
            sdir = None if snapshot_dir is None else valid.snapshot_dir(snapshot_dir)
            transport = await EpisodeTransport.open(find_agentvm(binary), snapshot=snapshot, snapshot_dir=sdir,
                                                    timeout=t, extra_args=args, fork_args=user_args, envs=env,
                                                    grace=g, start_timeout=st)
        return cls(transport, envs=env, metadata=meta, timeout=t)._track()

    @classmethod
    async def resume(cls, sandbox_id: str, *, url: Optional[str] = None, token: Optional[str] = None,
                     timeout: float = 300, envs: Optional[Mapping[str, str]] = None,
                     binary: Optional[str] = None, start_timeout: float = DEFAULT_START_TIMEOUT,
                     grace: float = DEFAULT_GRACE, agentvm_args: Sequence[str] = (),
                     snapshot_dir: Optional[str] = None) -> AsyncSandbox:
        """A paused sandbox, running again exactly as it was paused (:meth:`pause` returned
        ``sandbox_id``). Service mode (``url`` or ``$AGENTVM_URL``): the same sandbox under its
        id, with its settings. Embedded: ``sandbox_id`` is the paused snapshot's directory; the
        episode gets ``timeout``, ``envs`` for its exec calls (the shell kept its exports; envs
        other than the paused sandbox's are exported there too), and takes its own snapshots
        into ``snapshot_dir`` (default: the directory the paused snapshot is in). A snapshot the client keeps (a pause without ``snapshot_dir=``) is kept
        until it is resumed, or for a week."""
        valid.text("sandbox_id", sandbox_id)
        st = valid.number("start_timeout", start_timeout, low=0, high=MAX_CALL_TIMEOUT)
        g = valid.number("grace", grace, low=0, high=MAX_CALL_TIMEOUT)
        if url is None and os.sep not in sandbox_id:
            url = os.environ.get("AGENTVM_URL") or None
        if url is not None:
            if binary is not None or agentvm_args or snapshot_dir is not None or envs is not None:
                raise ValueError("binary, agentvm_args, snapshot_dir and envs are for embedded mode: a service "
                                 "resumes a sandbox with its own settings")
            if token is None:
                token = os.environ.get("AGENTVM_TOKEN") or None
            service = await ServiceTransport.resume(HttpClient.get(valid.text("url", url), token), sandbox_id,
                                                    grace=g, start_timeout=st)
            described = service.described
            return cls(service, envs={}, metadata=dict(described.get("metadata") or {}),
                       timeout=float(described.get("timeout", timeout)))._track()
        t = valid.number("timeout", timeout, low=1, high=MAX_SANDBOX_TIMEOUT, low_inclusive=True)
        env = valid.envs("envs", envs)
        if not os.path.isfile(os.path.join(sandbox_id, "manifest.json")):
            raise ValueError(f"{sandbox_id!r} is not a paused sandbox's snapshot (no manifest.json there)")
        user_args = [valid.text("agentvm_args item", a) for a in agentvm_args]
        sdir = valid.snapshot_dir(snapshot_dir if snapshot_dir is not None
                                  else os.path.dirname(os.path.abspath(sandbox_id)))
        episode = await EpisodeTransport.resume(find_agentvm(binary), sandbox_id, snapshot_dir=sdir, timeout=t,
                                                extra_args=user_args, envs=env, grace=g, start_timeout=st)
        return cls(episode, envs=env, metadata={}, timeout=t)._track()

    @classmethod
    async def list(cls, *, url: Optional[str] = None, token: Optional[str] = None) -> SandboxList:
        """Every sandbox of ``agentvm serve`` at ``url`` (or ``$AGENTVM_URL``), running and
        paused, as serve describes them (docs/api.md; what :meth:`info` gives). Asked of a fleet
        (a serve with peers, or the fleet's front door) it holds every node's sandboxes, and
        ``unreached_nodes`` names the nodes that did not answer, with why (``{"n3": "could not
        connect"}``): the list is then partial (docs/fleet.md). Service mode only."""
        if url is None:
            url = os.environ.get("AGENTVM_URL") or None
        if url is None:
            raise ValueError("list is for service mode: give url= or set AGENTVM_URL")
        if token is None:
            token = os.environ.get("AGENTVM_TOKEN") or None
        if token is not None:
            valid.text("token", token)
        return await list_sandboxes(HttpClient.get(valid.text("url", url), token))

    # -- fork and pause --------------------------------------------------------------------------

    async def fork(self, count: int = 1, *, start_timeout: float = DEFAULT_START_TIMEOUT) -> List[AsyncSandbox]:
        """``count`` new sandboxes, each this one as it is now (files, processes, the shell's
        cwd, variables and jobs, the interpreter's variables), with its timeout, envs and
        metadata; this one runs on. All start or none: if one fails, the others are killed."""
        if isinstance(count, bool) or not isinstance(count, int):
            raise TypeError("count must be an int")
        if not 1 <= count <= MAX_FORK_COUNT:
            raise ValueError(f"count must be 1 to {MAX_FORK_COUNT}")
        st = valid.number("start_timeout", start_timeout, low=0, high=MAX_CALL_TIMEOUT)
        self._check_alive()
        # The snapshot waits for every call in flight: this object's attachments are detached
        # and its watches stopped for it.
        async with attachments_suspended(self), watches_suspended(self):
            children = await self._transport.fork(count, st)
        return [AsyncSandbox(child, envs=dict(self.envs), metadata=dict(self.metadata), timeout=self.timeout)._track()
                for child in children]

    async def pause(self) -> str:
        """Saves the sandbox to disk and ends its VM (it holds no memory then); returns the id
        :meth:`resume` takes: serve's sandbox id, or (embedded) the snapshot's directory.
        Calls on this object raise :class:`SandboxDied` (``paused``) afterwards."""
        self._check_alive()
        async with attachments_suspended(self) as held, watches_suspended(self) as watches:
            resume_id = await self._transport.pause()
            held.end(paused_error())
            watches.end()
        self._paused = True
        _loop.unregister_exit(self._kill_at_exit)
        await self.ports._close_all()
        return resume_id

    # -- identity and life ---------------------------------------------------------------------

    @property
    def sandbox_id(self) -> str:
        """serve's sandbox id (``NODE-INSTANCE-RANDOM``), or ``ep-PID`` for an embedded episode."""
        return self._transport.sandbox_id

    @property
    def pid(self) -> Optional[int]:
        """The ``agentvm episode`` process behind the sandbox (on serve's host in service mode)."""
        return self._transport.pid

    @property
    def restored(self) -> Optional[bool]:
        """True when the VM was restored from a snapshot, False when it booted."""
        return self._transport.restored

    def info(self) -> Dict[str, Any]:
        """What is known of the sandbox (in service mode, serve's last description of it)."""
        return dict(self._transport.info())

    def _track(self) -> AsyncSandbox:
        # A sandbox still open when the interpreter exits is killed then (embedded: SIGTERM;
        # service: DELETE), without the event loop, which may be gone.
        _loop.register_exit(self._kill_at_exit)
        return self

    def _kill_at_exit(self) -> None:
        if not self._killed:
            self._killed = True
            self._transport.kill_at_exit()

    def _check_alive(self) -> None:
        if self._paused:
            raise SandboxDied("paused", "the sandbox is paused: resume it (Sandbox.resume) for a running one")
        if self._killed:
            raise SandboxDied("killed", "the sandbox was killed")

    async def kill(self) -> None:
        """Ends the sandbox and its VM at once (running calls fail with :class:`SandboxDied`).
        Embedded: SIGTERM to the episode (SIGKILL if it has not ended 30 s later); service:
        ``DELETE``. Its port forwards are closed. Killing a dead or paused sandbox does nothing
        (a paused one stays paused)."""
        if self._killed or self._paused:
            return
        self._killed = True
        _loop.unregister_exit(self._kill_at_exit)
        await self.ports._close_all()
        await self._transport.kill()

    async def is_running(self) -> bool:
        if self._killed or self._paused:
            return False
        return await self._transport.is_running()

    async def set_timeout(self, seconds: float) -> None:
        """The sandbox now ends ``seconds`` from now. Service: ``POST …/timeout``. Embedded:
        a client-side timer kills the episode then; it cannot end later than the ``timeout``
        the sandbox was created with (ValueError)."""
        s = valid.number("seconds", seconds, low=1, high=MAX_SANDBOX_TIMEOUT, low_inclusive=True)
        self._check_alive()
        await self._transport.set_timeout(s if s != int(s) else int(s))

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kill()

    # -- code ------------------------------------------------------------------------------------

    async def run_code(self, code: str, language: Optional[str] = None, context: Optional[ContextRef] = None,
                       timeout: Optional[float] = None, *, on_stdout: Optional[Output] = None,
                       on_stderr: Optional[Output] = None, on_display: Optional[OnDisplay] = None,
                       max_output: Optional[int] = None, request_timeout: Optional[float] = None) -> Execution:
        """Runs a cell in a persistent interpreter (protocol ``run_code``): ``context``'s (a
        :class:`CodeContext` or its id), else the default one of ``language`` (``"python"``,
        the default, or ``"bash"``). ``on_display`` gets the forms of each ``display()`` the
        cell makes (they are in the result's ``displays`` too)."""
        return await run_code(self, code, language, context, timeout, on_stdout=on_stdout, on_stderr=on_stderr,
                              on_display=on_display, max_output=max_output, request_timeout=request_timeout)

    async def create_code_context(self, language: str = "python", cwd: Optional[str] = None) -> CodeContext:
        """A new context (``ctx-N``) for ``run_code``: an interpreter of ``language``
        (``"python"`` or ``"bash"``) of its own, started at its first cell in ``cwd`` (default:
        the agent's). At most 16 besides the defaults (``AgentError`` ``limit``)."""
        return await contexts.create(self, language, cwd)

    async def list_code_contexts(self) -> List[CodeContext]:
        """Every context of the sandbox, ``default`` first, then in the order they were made."""
        return await contexts.list_all(self)

    async def restart_code_context(self, context: ContextRef) -> None:
        """Kills the context's interpreter (its state is lost; a cell running in it ends with
        ``state_lost``); its next cell starts a fresh one. ``default`` too."""
        await contexts.restart(self, context)

    async def remove_code_context(self, context: ContextRef) -> None:
        """Kills the context's interpreter and forgets the context (later cells naming it:
        :class:`NotFound`). ``default`` cannot be removed (``AgentError`` ``bad_field``)."""
        await contexts.remove(self, context)
