"""Remote endpoints a run or a sweep depends on (a Ray cluster's address, a tracking server),
probed before anything is claimed: a TCP connect and a first answer, each within
`CONNECT_TIMEOUT_S`, so an address where nothing listens, or a host that takes the connection
and never answers (a firewall that drops packets, a hung server), is one line at the start
instead of a hang: Ray's own connect and MLflow's retries each take minutes.

    probe_grpc("10.0.0.5:6379", "--ray-address 10.0.0.5:6379", "start the cluster first")
    probe_http("http://mlflow:5000", "MLFLOW_TRACKING_URI http://mlflow:5000", "...")

`timeout` (seconds) defaults to `CONNECT_TIMEOUT_S` as it is when the probe runs, so a test
can shorten it.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
import urllib.error
import urllib.request
from typing import Final

from lmcore.errors import TrainError

CONNECT_TIMEOUT_S: Final = 15.0  # a connect and a first answer each: a far cluster answers sooner
# The HTTP/2 connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS, its
# client server) answers with a SETTINGS frame of its own before anything else.
_H2_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS: Final = 4


def _seconds(timeout: float | None) -> float:
    return float(CONNECT_TIMEOUT_S if timeout is None else timeout)


def host_port(address: str, what: str, form: str) -> tuple[str, int]:
    """`HOST:PORT` (or `[IPv6]:PORT`, after any `scheme://`) as a host and a port number;
    `TrainError` naming `what` and the `form` expected otherwise."""
    rest = address.split("://", 1)[-1].split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TrainError(f"{what}: {address!r} is not an address: expected {form}")
    return host, int(port)


def connect(
    host: str, port: int, what: str, fix: str, timeout: float | None = None
) -> socket.socket:
    """A TCP connection to `host:port` within `timeout` seconds; `TrainError` naming `what`
    (and ending in `fix`) when it is refused, unreachable or not made in time."""
    timeout = _seconds(timeout)
    try:
        return socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        raise TrainError(
            f"{what}: no connection to {host}:{port} within {timeout:g} s (the connect timeout); "
            f"{fix}"
        ) from None
    except OSError as e:  # refused, unreachable, a name that does not resolve
        reason = e.strerror or type(e).__name__
        raise TrainError(f"{what}: cannot connect to {host}:{port} ({reason}); {fix}") from None


def probe_grpc(address: str, what: str, fix: str, timeout: float | None = None) -> None:
    """That a gRPC server answers at `address` (`HOST:PORT` or `ray://HOST:PORT`): a
    connection, then its HTTP/2 SETTINGS frame, each within `timeout` seconds."""
    seconds = _seconds(timeout)
    host, port = host_port(address, what, "HOST:PORT (e.g. 10.0.0.5:6379), ray://HOST:PORT or auto")
    with connect(host, port, what, fix, seconds) as sock:
        deadline = time.monotonic() + seconds
        try:
            sock.sendall(_H2_PREFACE)
            got = b""
            while len(got) < 9:  # a frame header: length (3), type, flags, stream id (4)
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = sock.recv(9 - len(got))
                if not chunk:
                    break
                got += chunk
        except TimeoutError:
            raise TrainError(
                f"{what}: {host}:{port} takes the connection but does not answer within "
                f"{seconds:g} s (the connect timeout); {fix}"
            ) from None
        except OSError as e:
            raise TrainError(
                f"{what}: {host}:{port} broke the connection ({e.strerror}); {fix}"
            ) from None
    if len(got) < 9 or got[3] != _H2_SETTINGS:
        raise TrainError(
            f"{what}: {host}:{port} answers, but not as a gRPC server (what a Ray cluster's "
            f"address is); {fix}"
        )


def probe_http(url: str, what: str, fix: str, timeout: float | None = None) -> None:
    """That an HTTP(S) server answers at `url` within `timeout` seconds (a connect, then any
    HTTP response, an error status included: the server is there). Proxies are those the
    environment names, as for the client that will talk to it."""
    seconds = _seconds(timeout)
    host, port = _url_host_port(url, what)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # is it there, not trust
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(urllib.request.Request(url, method="GET"), timeout=seconds):
            return
    except urllib.error.HTTPError:  # a status: the server answered
        return
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, TimeoutError | socket.timeout):
            raise TrainError(
                f"{what}: {host}:{port} does not answer within {seconds:g} s (the connect "
                f"timeout); {fix}"
            ) from None
        if isinstance(reason, ssl.SSLError):
            return  # a TLS server answered; its certificate is its client's business
        text = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
        raise TrainError(f"{what}: cannot connect to {host}:{port} ({text}); {fix}") from None
    except TimeoutError:
        raise TrainError(
            f"{what}: {host}:{port} takes the connection but does not answer within "
            f"{seconds:g} s (the connect timeout); {fix}"
        ) from None
    except http.client.HTTPException:  # something answered, not in HTTP/1
        raise TrainError(
            f"{what}: {host}:{port} answers, but not as an HTTP server; {fix}"
        ) from None
    except (OSError, ValueError) as e:  # a reset connection, a malformed URL
        raise TrainError(f"{what}: no answer from {url} ({e}); {fix}") from None


def _url_host_port(url: str, what: str) -> tuple[str, int]:
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    rest = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    if ":" in rest.rsplit("]", 1)[-1]:
        return host_port(rest, what, "http(s)://HOST[:PORT][/PATH]")
    return rest.strip("[]"), 443 if scheme == "https" else 80
