"""The process that holds a point's recording claim or runs a sweep, so that one that is gone is told apart from
one that is busy: its host, its pid and, where /proc says, its start time (a pid reused by a later process is
not taken for it)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


def _state_and_start(pid: int) -> tuple[str, str] | None:
    """A process's state letter and start time (clock ticks after boot): fields 3 and 22 of /proc/<pid>/stat;
    None where unreadable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return fields[0], fields[19]


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: str = ""  # its start time in clock ticks after boot (/proc); "" where unknown

    @classmethod
    def me(cls) -> Owner:
        found = _state_and_start(os.getpid())
        return cls(socket.gethostname(), os.getpid(), found[1] if found else "")

    @classmethod
    def parse(cls, text: str | None) -> Owner | None:
        """From `str(owner)` ("host pid [started]"); None if `text` is not one."""
        fields = (text or "").split()
        if len(fields) not in (2, 3) or not fields[1].isdigit():
            return None
        return cls(fields[0], int(fields[1]), fields[2] if len(fields) == 3 else "")

    def __str__(self) -> str:
        return " ".join(filter(None, (self.host, str(self.pid), self.started)))

    def gone(self) -> bool:
        """Whether this process has certainly ended: on this host, its pid is free, a zombie or another process's.
        A process on another host cannot be seen from here: never gone."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # another user's process: alive
            return False
        found = _state_and_start(self.pid)
        if found is None:  # it ended meanwhile, unless there is no /proc to tell
            return Path("/proc/self/stat").exists()
        state, started = found
        return state == "Z" or bool(self.started) and started != self.started
