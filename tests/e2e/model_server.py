"""A scripted model on 127.0.0.1 for the real harnesses: it plays each session's
tool calls in order and records every tool result the harness sends back, which
is exactly what a model would have seen.

It speaks the two streaming APIs the harnesses use: Anthropic's messages API
(``POST /v1/messages``, Claude Code) and OpenAI's responses API (``POST
/v1/responses``, Codex). A session is recognised by a marker (``[[NAME]]``) in
its prompt; its step is the number of tool calls already in the conversation
(the harness sends the whole conversation each time). Requests without a
marker (Claude Code's title and topic requests) get a short text answer.

A step is ``{"tool": NAME, "input": {...}}`` (a function call; Codex's
freeform ``apply_patch`` is ``{"tool": "apply_patch", "patch": TEXT}``), or
``{"text": ...}`` to end the turn. A step's ``"input_from": [KEY, REGEX]`` sets
``input[KEY]`` to REGEX's first group in what the session's last tool call returned
(a command the harness told the model to run). After the last step the session ends with
"done". A step may be ``{"wait": PATH, ...}``: the answer is held until PATH
exists, and ``{"after": [SESSION, N], ...}`` until SESSION has asked for its step
N (so its tool call N-1 and both its hooks are done): two sessions are put in a
chosen order without sleeping.

What the harness sent after each tool call is recorded per session: the tool
result and any text it added before the model's next turn (where a hook's
``additionalContext`` lands).
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MARKER = re.compile(r"\[\[([A-Za-z0-9_.-]+)\]\]")


class Script:
    """The sessions' steps and what came back, shared by the handler threads."""

    def __init__(self, sessions: dict[str, list[dict[str, Any]]]) -> None:
        self.sessions = sessions
        self.lock = threading.Lock()
        self.results: dict[str, list[dict[str, Any]]] = {name: [] for name in sessions}
        self.seen_ids: set[str] = set()
        self.requests: list[dict[str, Any]] = []  # (path, marker, step) for debugging
        self.tools: dict[str, list[str]] = {}  # the tools each harness offered
        self.progress: dict[str, int] = {}  # the highest step each session asked for
        self.cond = threading.Condition(self.lock)

    def record(self, session: str, call_id: str, name: str, output: Any, is_error: bool = False,
               extra: str = "", conversation: str = "") -> None:
        """Once per tool call of a conversation (the harness resends the whole of it each
        turn); ``conversation`` tells apart two sessions of one marker (a team engineer's
        fix round), whose call ids the script numbers alike."""
        key = f"{conversation}\0{call_id}"
        with self.lock:
            if key in self.seen_ids:
                return
            self.seen_ids.add(key)
            self.results.setdefault(session, []).append(
                {"call_id": call_id, "tool": name, "output": _text(output), "is_error": is_error, "extra": extra})

    def step(self, session: str, index: int) -> dict[str, Any]:
        with self.cond:
            self.progress[session] = max(self.progress.get(session, -1), index)
            self.cond.notify_all()
        steps = self.sessions.get(session, [])
        if index >= len(steps):
            return {"text": "done"}
        step = steps[index]
        after = step.get("after")
        if after:
            with self.cond:
                self.cond.wait_for(lambda: self.progress.get(after[0], -1) >= after[1],
                                   timeout=float(step.get("timeout", 60)))
        wait = step.get("wait")
        if wait:
            deadline = time.monotonic() + float(step.get("timeout", 60))
            while not os.path.exists(wait) and time.monotonic() < deadline:
                time.sleep(0.05)
        if "input_from" in step:
            key, pattern = step["input_from"]
            last = (self.outputs(session) or [""])[-1]
            m = re.search(pattern, last)
            step = {**step, "input": {**step.get("input", {}), key: m.group(1) if m else f"false # no {pattern!r}"}}
        return step

    def outputs(self, session: str) -> list[str]:
        """Each tool call's result, with what the harness added after it."""
        with self.lock:
            return [r["output"] + ("\n" + r["extra"] if r["extra"] else "") for r in self.results.get(session, [])]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(c.get("text", c.get("content", ""))) if isinstance(c, dict) else str(c)
                         for c in content)
    if isinstance(content, dict):
        return _text(content.get("text") or content.get("content") or json.dumps(content))
    return json.dumps(content)


def _conversation(body: dict[str, Any]) -> str:
    """What identifies one conversation: its first user message (the session's prompt)."""
    if "messages" in body:
        first = next((m for m in body["messages"] if m.get("role") == "user"), None)
        return _text(first.get("content")) if first else ""
    items = body.get("input") if isinstance(body.get("input"), list) else []
    seen = []
    for u in (i for i in items if isinstance(i, dict) and i.get("role") == "user"):
        seen.append(_text(u.get("content")))  # Codex's environment context, then the prompt
        if MARKER.search(seen[-1]):
            break
    return "\n".join(seen)


def _marker(body: dict[str, Any]) -> str | None:
    """The session marker, from the first user message only (tool results may quote others)."""
    if "messages" in body:
        first = next((m for m in body["messages"] if m.get("role") == "user"), None)
        m = MARKER.search(_text(first.get("content")) if first else "")
    else:
        items = body.get("input") if isinstance(body.get("input"), list) else []
        users = [i for i in items if isinstance(i, dict) and i.get("role") == "user"]
        m = None
        for u in users:  # Codex sends its environment context as user messages first
            m = MARKER.search(_text(u.get("content")))
            if m:
                break
    return m.group(1) if m else None


class Handler(BaseHTTPRequestHandler):
    script: Script
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        data = b'{"data": [], "models": []}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = {}
        path = self.path.split("?")[0]
        raw_dir = os.environ.get("STORM_E2E_RAW")  # every request as sent, for debugging a scenario
        if raw_dir:
            os.makedirs(raw_dir, exist_ok=True)
            with open(os.path.join(raw_dir, f"{time.time():.6f}.json"), "wb") as fh:
                fh.write(raw)
        if path.endswith("/messages/count_tokens"):
            return self._json({"input_tokens": 10})
        if path.endswith("/messages"):
            return self._anthropic(body)
        if path.endswith("/responses"):
            return self._openai(body)
        self._json({})

    # -- plumbing --------------------------------------------------------------------
    def _json(self, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        out = b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    # -- Anthropic messages ----------------------------------------------------------
    def _anthropic(self, body: dict[str, Any]) -> None:
        s = self.script
        session = _marker(body)
        conversation = _conversation(body)
        messages = body.get("messages") or []
        names = {}
        for i, m in enumerate(messages):
            blocks = m.get("content") if isinstance(m.get("content"), list) else []
            for c in blocks:
                if c.get("type") == "tool_use":
                    names[c.get("id")] = c.get("name")
            results = [c for c in blocks if c.get("type") == "tool_result"]
            if not results or not session:
                continue
            # what else the harness sent before the model's next turn (hook context, reminders)
            extra = [_text(c.get("text", "")) for c in blocks if c.get("type") == "text"]
            for later in messages[i + 1:]:  # Claude Code 2.1.332 sends hook feedback as a "system" message
                if later.get("role") not in ("user", "system"):
                    break
                extra.append(_text(later.get("content")))
            for c in results:
                s.record(session, c.get("tool_use_id"), names.get(c.get("tool_use_id"), "?"), c.get("content"),
                         bool(c.get("is_error")), "\n".join(x for x in extra if x), conversation)
        if session and body.get("tools"):
            s.tools.setdefault("claude", [t.get("name") for t in body["tools"]])
        index = sum(1 for m in messages if m.get("role") == "assistant")
        step = s.step(session, index) if session and body.get("tools") else {"text": "ok"}
        with s.lock:
            s.requests.append({"api": "anthropic", "session": session, "step": index})
        model = body.get("model", "claude")
        if "tool" in step:
            block = {"type": "tool_use", "id": f"toolu_{session}_{index}", "name": step["tool"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(step.get("input", {}))}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": step.get("text", "done")}
            stop = "end_turn"
        if not body.get("stream"):
            content = ([{**block, "input": step.get("input", {})}] if "tool" in step
                       else [{"type": "text", "text": delta["text"]}])
            return self._json({"id": f"msg_{index}", "type": "message", "role": "assistant", "model": model,
                               "content": content, "stop_reason": stop, "stop_sequence": None,
                               "usage": {"input_tokens": 10, "output_tokens": 10}})
        self._sse([
            ("message_start", {"type": "message_start", "message": {
                "id": f"msg_{session}_{index}", "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": 1}}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                               "usage": {"output_tokens": 10}}),
            ("message_stop", {"type": "message_stop"}),
        ])

    # -- OpenAI responses ------------------------------------------------------------
    def _openai(self, body: dict[str, Any]) -> None:
        s = self.script
        session = _marker(body)
        conversation = _conversation(body)
        items = body.get("input") if isinstance(body.get("input"), list) else []
        names = {}
        calls = 0
        for i, it in enumerate(items):
            t = it.get("type") if isinstance(it, dict) else None
            if t in ("function_call", "custom_tool_call", "local_shell_call"):
                calls += 1
                names[it.get("call_id")] = it.get("name", t)
            elif t in ("function_call_output", "custom_tool_call_output") and session:
                extra = []
                for earlier in reversed(items[:i]):  # Codex puts hook context just before the output
                    if not isinstance(earlier, dict) or earlier.get("type") not in (None, "message"):
                        break
                    extra.insert(0, _text(earlier.get("content")))
                for later in items[i + 1:]:  # ... or after it
                    if not isinstance(later, dict) or later.get("type") not in (None, "message"):
                        break
                    extra.append(_text(later.get("content")))
                s.record(session, it.get("call_id"), names.get(it.get("call_id"), "?"), it.get("output"),
                         extra="\n".join(x for x in extra if x), conversation=conversation)
        if session and body.get("tools"):
            s.tools.setdefault("codex", [t.get("name") or t.get("type") for t in body["tools"]])
        step = s.step(session, calls) if session else {"text": "ok"}
        with s.lock:
            s.requests.append({"api": "openai", "session": session, "step": calls})
        rid = f"resp_{session}_{calls}"
        if "tool" in step and step["tool"] == "apply_patch" and "patch" in step:
            item = {"type": "custom_tool_call", "id": f"ctc_{session}_{calls}", "status": "completed",
                    "call_id": f"call_{session}_{calls}", "name": "apply_patch", "input": step["patch"]}
        elif "tool" in step:
            item = {"type": "function_call", "id": f"fc_{session}_{calls}", "status": "completed",
                    "call_id": f"call_{session}_{calls}", "name": step["tool"],
                    "arguments": json.dumps(step.get("input", {}))}
        else:
            item = {"type": "message", "id": f"msg_{session}_{calls}", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": step.get("text", "done"), "annotations": []}]}
        response = {"id": rid, "object": "response", "created_at": int(time.time()), "status": "in_progress",
                    "model": body.get("model"), "output": []}
        done = {**response, "status": "completed", "output": [item],
                "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 20}}
        self._sse([
            ("response.created", {"type": "response.created", "response": response}),
            ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0,
                                            "item": item}),
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": done}),
        ])


def serve(script: Script) -> tuple[ThreadingHTTPServer, int]:
    """Start the server on 127.0.0.1 (a free port) in a daemon thread."""
    handler = type("ScriptedHandler", (Handler,), {"script": script})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]
