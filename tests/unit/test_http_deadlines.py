"""One deadline per call: a real loopback server that answers at once but trickles its body
one byte every 0.2 s must be cut at the timeout and treated as one (retried, then the
rollout is discarded or the sample flagged), whatever the per-read timeout would allow."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from agentrft.errors import ToolUnavailable
from agentrft.graders import build_grader
from agentrft.tools.http import HttpTool, new_client, post_with_retries
from agentrft.types import ToolCall


def _serve(conn: socket.socket, stop: threading.Event) -> None:
    with conn:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            0,
        )
        while len(body) < length:
            body += conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"
        )
        for _ in range(200):  # 40 s if nobody cuts it
            if stop.wait(0.2):
                return
            try:
                conn.sendall(b" ")
            except OSError:
                return


@pytest.fixture
def trickle_url() -> Iterator[str]:
    stop = threading.Event()
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.1)
    threads: list[threading.Thread] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            t = threading.Thread(target=_serve, args=(conn, stop), daemon=True)
            t.start()
            threads.append(t)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}/slow"
    finally:
        stop.set()
        acceptor.join(timeout=5)
        for t in threads:
            t.join(timeout=5)
        srv.close()


def test_trickling_reply_is_cut_at_the_deadline_and_retried_as_a_timeout(trickle_url: str) -> None:
    async def main() -> None:
        async with new_client() as client:
            await post_with_retries(
                client, trickle_url, b"{}", headers={}, timeout=1.0, retries=1, backoff_s=0.0
            )

    t0 = time.perf_counter()
    with pytest.raises(Exception, match=r"timed out after 1s \(after 2 attempts\)"):
        asyncio.run(main())
    assert time.perf_counter() - t0 < 4  # two attempts of 1 s each, not 2 x 40 s


def test_trickling_tool_discards_the_rollout_at_its_deadline(trickle_url: str) -> None:
    class Spec:
        name = "slow"
        server_url = trickle_url
        headers: dict[str, str] = {}
        timeout_s = None

    tool = HttpTool(Spec(), timeout_s=1.0, retries=1, backoff_s=0.0)

    async def main() -> None:
        async with httpx.AsyncClient() as client:
            await tool(ToolCall("fc_1", "call_1", "slow", "{}"), "trace_x", {}, client)

    t0 = time.perf_counter()
    with pytest.raises(ToolUnavailable, match="timed out"):
        asyncio.run(main())
    assert time.perf_counter() - t0 < 4


def test_trickling_endpoint_grader_is_flagged_at_its_deadline(trickle_url: str) -> None:
    g = build_grader(
        {"type": "endpoint", "url": trickle_url, "timeout_s": 1, "retries": 1, "backoff_s": 0}
    )
    t0 = time.perf_counter()
    grade = g.grade({"output_text": "x"}, {}, "trace_y")
    assert grade.error == "unresponsive_reward_error"
    assert "timed out" in grade.metrics["error_details"]
    assert time.perf_counter() - t0 < 4
