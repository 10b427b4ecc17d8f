"""uvicorn's server, telling the application when its shutdown begins.

uvicorn waits for every open response to finish before it sends the lifespan's
shutdown event, so a response that never ends by itself (a ``subscriptions/listen``
stream) would keep a stopping server alive for as long as its client stays
connected. The application is told first and ends such responses gracefully.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, begin_shutdown: Callable[[], None] | None) -> None:
        super().__init__(config)
        self._begin_shutdown = begin_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._begin_shutdown is not None:
            self._begin_shutdown()
        await super().shutdown(sockets)
