"""The one background event loop on which every synchronous object of this package runs its
coroutines (a thread of its own, started at first use; never a thread per sandbox)."""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import threading
from typing import Any, Callable, Coroutine, Optional, Set, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: Optional[asyncio.AbstractEventLoop] = None
_thread: Optional[threading.Thread] = None
# Blocking cleanups (of sandboxes still open) run at interpreter exit. They use neither this
# loop nor the HTTP thread pool: by the time atexit handlers run, concurrent.futures has shut
# its pools down already.
_at_exit: Set[Callable[[], None]] = set()


def _run(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    loop.run_forever()


def get_loop() -> asyncio.AbstractEventLoop:
    global _loop, _thread
    with _lock:
        if _loop is None or _thread is None or not _thread.is_alive():
            loop = asyncio.new_event_loop()
            ready = threading.Event()
            thread = threading.Thread(target=_run, args=(loop, ready), name="agentvm-loop", daemon=True)
            thread.start()
            ready.wait()
            _loop, _thread = loop, thread
        return _loop


def in_loop_thread() -> bool:
    return _thread is not None and threading.current_thread() is _thread


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Runs ``coro`` on the background loop and waits for its result in this thread."""
    if in_loop_thread():
        coro.close()
        raise RuntimeError("a synchronous agentvm object was used from agentvm's own event-loop thread "
                           "(e.g. inside an on_stdout callback); use the Async* classes there")
    fut = asyncio.run_coroutine_threadsafe(coro, get_loop())
    try:
        return fut.result()
    except (KeyboardInterrupt, SystemExit):
        fut.cancel()
        raise
    except concurrent.futures.CancelledError:
        raise


def register_exit(cleanup: Callable[[], None]) -> None:
    _at_exit.add(cleanup)


def unregister_exit(cleanup: Callable[[], None]) -> None:
    _at_exit.discard(cleanup)


@atexit.register
def _shutdown() -> None:
    for cleanup in list(_at_exit):
        try:
            cleanup()
        except Exception:
            pass
    _at_exit.clear()
