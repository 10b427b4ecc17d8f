"""A nameserver that never answers, as ``getaddrinfo`` meets it: for the tests of the
DNS lookup threads' shares (remote clones, metadata documents)."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest


@dataclass
class SlowNameserver:
    """Each lookup of ``*.slow.example`` holds its thread (counted in ``entered``) until
    ``release`` is set, then fails; every other host resolves to ``answer``."""

    answer: str = "93.184.216.34"
    release: threading.Event = field(default_factory=threading.Event)
    entered: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def getaddrinfo(self, host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if host.endswith(".slow.example"):
            self.entered.release()
            self.release.wait(120)
            raise socket.gaierror("no answer")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (self.answer, port))]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> SlowNameserver:
        monkeypatch.setattr(socket, "getaddrinfo", self.getaddrinfo)
        return self
