"""Probing a remote endpoint before anything is claimed: a connect and a first answer, each
within the connect timeout; one line naming the address otherwise (issue 32)."""

from __future__ import annotations

import time

import pytest

from lmcore.errors import TrainError
from lmcore.train import endpoints
from lmcore.train.endpoints import host_port, probe_grpc, probe_http
from tests.helpers.errors import raises_naming
from tests.helpers.net import closed_port, http_server, silent_port

FIX = "start it first"


def test_an_address_is_host_and_port_after_any_scheme() -> None:
    assert host_port("10.0.0.5:6379", "w", "F") == ("10.0.0.5", 6379)
    assert host_port("ray://head:10001", "w", "F") == ("head", 10001)
    assert host_port("[::1]:80", "w", "F") == ("::1", 80)
    for bad in ("head", "head:", ":80", "head:port", "head:70000"):
        with raises_naming(TrainError, "--ray-address", repr(bad), "expected HOST:PORT"):
            host_port(bad, "--ray-address", "HOST:PORT")


@pytest.mark.parametrize("probe", [probe_grpc, probe_http])
def test_a_closed_port_is_one_line_naming_the_address(probe: object) -> None:
    port = closed_port()
    address = f"127.0.0.1:{port}" if probe is probe_grpc else f"http://127.0.0.1:{port}"
    start = time.monotonic()
    with raises_naming(TrainError, f"--where {address}: cannot connect to 127.0.0.1:{port}",
                       "refused", FIX):  # fmt: skip
        probe(address, f"--where {address}", FIX, 1.0)  # type: ignore[operator]
    assert time.monotonic() - start < 1.0


@pytest.mark.parametrize("probe", [probe_grpc, probe_http])
def test_a_port_that_never_answers_fails_after_the_timeout(
    probe: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(endpoints, "CONNECT_TIMEOUT_S", 0.5)  # the default, as a test sets it
    with silent_port() as port:
        address = f"127.0.0.1:{port}" if probe is probe_grpc else f"http://127.0.0.1:{port}"
        start = time.monotonic()
        with raises_naming(TrainError, f"127.0.0.1:{port}", "does not answer within 0.5 s",
                           "connect timeout", FIX):  # fmt: skip
            probe(address, "w", FIX)  # type: ignore[operator]
        assert 0.5 <= time.monotonic() - start < 3


def test_an_http_server_answering_any_status_is_there() -> None:
    with http_server(404) as port:
        probe_http(f"http://127.0.0.1:{port}/", "w", FIX, 2.0)
        with raises_naming(TrainError, f"127.0.0.1:{port} answers, but not as a gRPC server"):
            probe_grpc(f"127.0.0.1:{port}", "w", FIX, 2.0)


def test_a_grpc_server_answers_the_handshake() -> None:
    grpc = pytest.importorskip("grpc", reason="grpcio comes with the 'ray' extra")
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        probe_grpc(f"127.0.0.1:{port}", "w", FIX, 2.0)
        with raises_naming(TrainError, f"127.0.0.1:{port} answers, but not as an HTTP server"):
            probe_http(f"http://127.0.0.1:{port}", "w", FIX, 2.0)
    finally:
        server.stop(None)
