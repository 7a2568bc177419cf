"""An outsider's fetch of a block from a Spark driver's block manager, in Spark's network protocol without any
authentication (OpenBlocks, then its chunks): how a release's secret was read off an unsecured driver (the task
closure holding it is a broadcast block). Used by the attack test, which checks it against an unsecured driver
first, so its failure against the service's driver means something."""

from __future__ import annotations

import socket
import struct


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">i", len(data)) + data


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the driver closed the connection")
        data += chunk
    return data


def _frame(sock: socket.socket) -> bytes:
    length = struct.unpack(">q", _exactly(sock, 8))[0]
    return _exactly(sock, length - 8)


def fetch_block(host: str, port: int, app_id: str, block_id: str, timeout: float = 10.0) -> bytes:
    """The block's bytes; raises (EOFError, OSError, ValueError) when the driver does not hand it over."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        body = bytes([0]) + _string(app_id) + _string("driver") + struct.pack(">i", 1) + _string(block_id)
        request = bytes([3]) + struct.pack(">qi", 1, len(body)) + body  # RpcRequest(OpenBlocks)
        sock.sendall(struct.pack(">q", 8 + len(request)) + request)
        answer = _frame(sock)
        if answer[0] != 4:  # RpcResponse
            raise ValueError(f"no stream handle: message type {answer[0]}")
        length = struct.unpack(">i", answer[9:13])[0]
        handle = answer[13:13 + length]
        stream = struct.unpack(">q", handle[1:9])[0]
        chunk = bytes([0]) + struct.pack(">qi", stream, 0)  # ChunkFetchRequest
        sock.sendall(struct.pack(">q", 8 + len(chunk)) + chunk)
        answer = _frame(sock)
        if answer[0] != 1:  # ChunkFetchSuccess
            raise ValueError(f"no chunk: message type {answer[0]}")
        return answer[13:]
