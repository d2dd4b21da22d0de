"""Where embedded mode finds the ``agentvm`` binary."""
from __future__ import annotations

import os
import shutil
from typing import List, Optional

from .errors import BinaryNotFound


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_agentvm(explicit: Optional[str] = None) -> str:
    """``explicit`` if given; else ``$AGENTVM_BIN``, then ``agentvm`` in ``$PATH``, then the
    checkout's ``build/agentvm`` (when this package is used from a clone: ``python/agentvm/``
    two levels under the repository). Raises :class:`BinaryNotFound` naming each place."""
    looked: List[str] = []
    if explicit is not None:
        if _executable(explicit):
            return explicit
        raise BinaryNotFound([f"binary={explicit!r} (not an executable file)"])
    env = os.environ.get("AGENTVM_BIN")
    if env:
        if _executable(env):
            return env
        looked.append(f"AGENTVM_BIN={env} (not an executable file)")
    else:
        looked.append("AGENTVM_BIN (not set)")
    found = shutil.which("agentvm")
    if found:
        return found
    looked.append(f"agentvm in PATH ({os.environ.get('PATH', '')})")
    here = os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.normpath(os.path.join(here, "..", "..", "build", "agentvm"))
    if _executable(checkout):
        return checkout
    looked.append(checkout)
    raise BinaryNotFound(looked)
