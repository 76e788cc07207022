"""A stand-in for the model providers: a local HTTP server that streams the
real SSE formats of Anthropic's Messages API (``POST /v1/messages``) and
OpenAI's chat completions (``POST /v1/chat/completions``), so the official
SDKs can be pointed at it with ``base_url``. The only mock in these tests.

Each response follows the :class:`Script` set for the next call: how many
input and output tokens, how often Anthropic reports cumulative usage, and
whether the stream fails (an SSE ``error`` event) after some output tokens.
Every output token is one text delta, ``"tok "``, so a count of deltas and a
count of tokens agree.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOKEN = "tok "


@dataclass
class Script:
    input_tokens: int = 120
    output_tokens: int = 300
    #: Anthropic: a ``message_delta`` with the cumulative output count every
    #: this many tokens (0: only the final one, as the real API does).
    usage_every: int = 100
    #: Emit the provider's error event after this many output tokens.
    fail_after: int | None = None
    #: Refuse the call with this HTTP status before streaming anything.
    refuse_status: int | None = None
    model: str = "fake-model-1"
    #: Prompt tokens read from the provider's cache: Anthropic's
    #: ``cache_read_input_tokens`` (beside ``input_tokens``), OpenAI's
    #: ``prompt_tokens_details.cached_tokens`` (part of ``prompt_tokens``,
    #: which is ``input_tokens`` here).
    cache_read_tokens: int | None = None
    #: Anthropic's ``cache_creation_input_tokens`` (beside ``input_tokens``).
    cache_creation_tokens: int | None = None


class FakeProvider:
    def __init__(self) -> None:
        self.script = Script()
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with provider._lock:
                    provider.requests.append((self.path, body))
                    script = provider.script
                if self.path == "/v1/messages":
                    events = anthropic_events(script)
                elif self.path == "/v1/chat/completions":
                    events = openai_events(script)
                else:
                    self.send_error(404)
                    return
                if script.refuse_status is not None:
                    error = json.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
                    payload = error.encode()
                    self.send_response(script.refuse_status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.send_header("connection", "close")
                    self.end_headers()
                    self.wfile.write(payload)
                    self.close_connection = True
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.send_header("connection", "close")
                self.end_headers()
                try:
                    for event in events:
                        data = event.encode()
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client hung up: a real provider stops here too
                self.close_connection = True

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def reset(self, script: Script | None = None) -> None:
        with self._lock:
            self.script = script or Script()
            self.requests = []

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _sse(event: str | None, data: Any) -> str:
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n"


def anthropic_events(s: Script) -> list[str]:
    out = [
        _sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_fake",
                    "type": "message",
                    "role": "assistant",
                    "model": s.model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        "input_tokens": s.input_tokens,
                        "output_tokens": 1,
                        "cache_creation_input_tokens": s.cache_creation_tokens,
                        "cache_read_input_tokens": s.cache_read_tokens,
                    },
                },
            },
        ),
        _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        _sse("ping", {"type": "ping"}),
    ]
    for n in range(1, s.output_tokens + 1):
        out.append(
            _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": TOKEN}})
        )
        if s.fail_after is not None and n == s.fail_after:
            out.append(_sse("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
            return out
        if s.usage_every and n % s.usage_every == 0 and n < s.output_tokens:
            out.append(
                _sse(
                    "message_delta",
                    {"type": "message_delta", "delta": {"stop_reason": None, "stop_sequence": None}, "usage": {"output_tokens": n}},
                )
            )
    out += [
        _sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": s.output_tokens},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return out


def openai_events(s: Script) -> list[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None, choices: bool = True) -> str:
        return _sse(
            None,
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 1_700_000_000,
                "model": s.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}] if choices else [],
                "usage": usage,
            },
        )

    out = [chunk({"role": "assistant", "content": ""})]
    for n in range(1, s.output_tokens + 1):
        out.append(chunk({"content": TOKEN}))
        if s.fail_after is not None and n == s.fail_after:
            out.append(_sse(None, {"error": {"message": "The server had an error", "type": "server_error"}}))
            return out
    out.append(chunk({}, finish="stop"))
    out.append(
        chunk(
            {},
            usage={
                "prompt_tokens": s.input_tokens,
                "completion_tokens": s.output_tokens,
                "total_tokens": s.input_tokens + s.output_tokens,
                **({} if s.cache_read_tokens is None else {"prompt_tokens_details": {"cached_tokens": s.cache_read_tokens}}),
            },
            choices=False,
        )
    )
    out.append(_sse(None, "[DONE]"))
    return out
