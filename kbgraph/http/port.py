"""Can the service listen where it was told? Checked before a command writes or prints
anything that looks ready (a config, a token, example calls).

uvicorn would find a taken port only once it binds, after all of that, and say it as a raw
``[Errno 98]``. ``port_problem`` binds the address as uvicorn will (``SO_REUSEADDR``, the
address family of the host) and lets go at once: a port another process listens on is named,
with ``--port`` to choose another. Another process could still take the port in between; then
uvicorn's own error stands.
"""

from __future__ import annotations

import errno
import socket


def port_problem(host: str, port: int) -> str | None:
    """Why the service cannot listen on ``host``:``port``, or None."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not 0 <= port <= 65535:
        return f"--port {port}: expected a TCP port from 0 to 65535"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"--host {host}: cannot listen there ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return (
                    f"port {port} on {host} is already in use (another service, or a kbgraph"
                    f" still running): choose another with --port, e.g. --port {_other(port)}"
                )
            if exc.errno == errno.EACCES:
                return (
                    f"cannot listen on {where}: permission denied (ports below 1024 need"
                    f" privileges): choose another with --port, e.g. --port 8080"
                )
            return f"cannot listen on {where}: {exc.strerror or exc}"
    return None


def _other(port: int) -> int:
    return port + 1 if 1024 <= port < 65535 else 8081
