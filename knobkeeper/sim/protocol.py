"""The three API dialects the sim speaks: request parsing and response / stream shapes.

    chat         POST /v1/chat/completions  OpenAI chat (messages, max_completion_tokens | max_tokens)
    completions  POST /v1/completions       OpenAI completions (prompt, max_tokens, default 16)
    generate     POST /generate             SGLang native (text | input_ids, sampling_params)

Parsing turns a JSON body into one `GenRequest` (the same fields whatever the dialect), or raises
`SimError` with the HTTP status and a one-line message. The shapes turn a request's progress into
response bytes: `complete_body` for a plain answer, a `Stream` for server-sent events. Streamed chunks
are built from pre-rendered JSON fragments (no json.dumps per token: at concurrency 96 on 2 cores the
per-token cost is what matters). Output text is deterministic filler (`filler_text`).

No I/O here and nothing of the engine: the server feeds these functions and writes what they return.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

# Deterministic filler output: token i is WORDS[i % len(WORDS)] with a leading space. Plain ASCII
# letters, so they go into JSON strings without escaping.
WORDS = (
    "the quick brown fox jumps over a lazy dog while simulated engines keep their knobs in git and "
    "every change carries evidence so that reverts can be audited and lost throughput reclaimed by "
    "one command with prefill decode router and sim playing the parts of a real serving stack today"
).split()
_TOK = tuple(" " + w for w in WORDS)
_NW = len(_TOK)
_CYCLE = "".join(_TOK)
_OFF = [0]
for _t in _TOK:
    _OFF.append(_OFF[-1] + len(_t))


def filler_text(start: int, end: int) -> str:
    """Text of output tokens [start, end)."""
    if end <= start:
        return ""
    if end - start == 1:
        return _TOK[start % _NW]
    a, b = start % _NW, end - start
    head = _CYCLE[_OFF[a]:]
    if b <= _NW - a:
        return _CYCLE[_OFF[a]:_OFF[a + b]]
    b -= _NW - a
    return head + _CYCLE * (b // _NW) + _CYCLE[:_OFF[b % _NW]]


def approx_tokens(text: str) -> int:
    """Prompt-token approximation: one token per 4 characters (at least 1)."""
    return max(1, (len(text) + 3) // 4)


class SimError(Exception):
    def __init__(self, status: int, message: str, type_: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.type = status, message, type_


def error_body(status: int, message: str, type_: str) -> bytes:
    """OpenAI's error object plus SGLang's top-level message/code (clients read either)."""
    return json.dumps({"error": {"message": message, "type": type_, "code": status}, "object": "error",
                       "message": message, "code": status}).encode()


@dataclass
class GenRequest:
    """One generation request, whatever dialect it came in."""

    kind: str
    rid: str
    prompt_tokens: int
    max_new: int
    stream: bool = False
    ignore_eos: bool = False
    include_usage: bool = False
    room: int | None = None
    bootstrap: tuple[str, int] | None = None  # (host, port) of the prefill worker's bootstrap server


def parse(kind: str, body: Any, context_length: int) -> GenRequest:
    """A request body of dialect `kind` -> GenRequest, or SimError(400, one line)."""
    if not isinstance(body, dict):
        raise SimError(400, "request body must be a JSON object")
    if kind == "generate":
        prompt_tokens, max_new, ignore_eos = _parse_generate(body)
        include_usage = False
    else:
        if kind == "chat":
            prompt_tokens, max_new = _parse_chat(body)
        else:
            prompt_tokens, max_new = _parse_completions(body)
        ignore_eos = bool(body.get("ignore_eos", False))
        so = body.get("stream_options") or {}
        include_usage = bool(isinstance(so, dict) and so.get("include_usage"))
    try:
        max_new = int(max_new)
    except (TypeError, ValueError):
        raise SimError(400, f"max tokens must be an integer, got {max_new!r}") from None
    if max_new < 1:
        raise SimError(400, f"max tokens must be >= 1, got {max_new}")
    if prompt_tokens + max_new > context_length:
        raise SimError(400, f"prompt ({prompt_tokens} tokens) + max tokens ({max_new}) exceeds "
                            f"the context length {context_length}")
    req = GenRequest(kind=kind, rid=str(body.get("rid") or uuid.uuid4().hex), prompt_tokens=prompt_tokens,
                     max_new=max_new, stream=bool(body.get("stream", False)), ignore_eos=ignore_eos,
                     include_usage=include_usage)
    room = body.get("bootstrap_room")
    if room is not None:
        try:
            req.room = int(room)
            req.bootstrap = (str(body.get("bootstrap_host") or "127.0.0.1"), int(body["bootstrap_port"]))
        except (KeyError, TypeError, ValueError):
            raise SimError(400, "bootstrap_room needs bootstrap_host and an integer bootstrap_port") from None
    return req


def _parse_generate(body: dict) -> tuple[int, Any, bool]:
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise SimError(400, "sampling_params must be an object")
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
        raise SimError(400, "batched /generate (a list of prompts) is not supported by the sim")
    if isinstance(text, str):
        prompt_tokens = approx_tokens(text)
    elif isinstance(ids, list):
        prompt_tokens = max(1, len(ids))
    else:
        raise SimError(400, "/generate needs 'text' (a string) or 'input_ids' (a list of ints)")
    return prompt_tokens, sp.get("max_new_tokens", 128), bool(sp.get("ignore_eos", False))


def _parse_chat(body: dict) -> tuple[int, Any]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise SimError(400, "'messages' must be a non-empty list")
    n = 0
    for m in msgs:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        n += approx_tokens(content or "") + 4  # + chat-template overhead per message
    return n, body.get("max_completion_tokens", body.get("max_tokens")) or 128


def _parse_completions(body: dict) -> tuple[int, Any]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        prompt_tokens = approx_tokens(prompt)
    elif isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
        prompt_tokens = max(1, len(prompt))
    else:
        raise SimError(400, "'prompt' must be a string or a list of token ids (batches are not supported by the sim)")
    max_new = body.get("max_tokens")
    return prompt_tokens, 16 if max_new is None else max_new  # 16: OpenAI's default for completions


# ---------------------------------------------------------------- response shapes

def usage(prompt_tokens: int, generated: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": generated, "total_tokens": prompt_tokens + generated}


def meta_info(req, finished: bool, role: str) -> dict:
    """SGLang's meta_info of a /generate answer; `req` is an engine request (rid, tokens, timestamps)."""
    fr = None
    if finished:
        fr = {"type": "length", "length": req.generated} if req.finish_reason == "length" \
            else {"type": "stop", "matched": "<eos>"}
    m = {"id": req.rid, "finish_reason": fr, "prompt_tokens": req.prompt_tokens,
         "completion_tokens": req.generated, "cached_tokens": 0}
    if finished:
        m["e2e_latency"] = req.t.get("finished_at", time.time()) - req.t["received_at"]
        m["sim"] = {"role": role, "bootstrap_room": req.room, **req.t}
    return m


def complete_body(kind: str, req, model_name: str, role: str) -> bytes:
    """The whole answer of a finished, non-streamed request."""
    text = filler_text(0, req.generated)
    if kind == "generate":
        out = {"text": text, "meta_info": meta_info(req, True, role)}
    elif kind == "chat":
        out = {"id": f"chatcmpl-{req.rid}", "object": "chat.completion", "created": int(time.time()),
               "model": model_name,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                            "logprobs": None, "finish_reason": req.finish_reason}],
               "usage": usage(req.prompt_tokens, req.generated)}
    else:
        out = {"id": f"cmpl-{req.rid}", "object": "text_completion", "created": int(time.time()),
               "model": model_name,
               "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": req.finish_reason}],
               "usage": usage(req.prompt_tokens, req.generated)}
    return json.dumps(out).encode()


class Stream:
    """Server-sent events of one streamed request: `opening()`, then `chunk(sent, n, fin)` for each new
    batch of tokens [sent, n) (fin: the last one), then `closing(include_usage)`."""

    def __init__(self, kind: str, req, model_json: str, role: str, incremental_generate: bool):
        self.kind, self.req, self.role = kind, req, role
        self.cumulative = kind == "generate" and not incremental_generate  # SGLang's default
        rid = json.dumps(req.rid)[1:-1]
        created = int(time.time())
        if kind == "chat":
            self.head = (f'data: {{"id":"chatcmpl-{rid}","object":"chat.completion.chunk",'
                         f'"created":{created},"model":{model_json},"choices":[{{"index":0,')
        elif kind == "completions":
            self.head = (f'data: {{"id":"cmpl-{rid}","object":"text_completion",'
                         f'"created":{created},"model":{model_json},"choices":[{{"index":0,')
        else:
            self.head = ""

    def opening(self) -> str:
        if self.kind == "chat":
            return self.head + '"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n'
        return ""

    def chunk(self, sent: int, n: int, fin: bool) -> str:
        req = self.req
        if self.kind == "generate":
            text = filler_text(0, n) if self.cumulative else filler_text(sent, n)
            return "data: " + json.dumps({"text": text, "meta_info": meta_info(req, fin, self.role)}) + "\n\n"
        if self.kind == "chat":
            out = ""
            if n > sent:
                out = self.head + '"delta":{"content":"' + filler_text(sent, n) + '"},"logprobs":null,"finish_reason":null}]}\n\n'
            if fin:
                out += self.head + f'"delta":{{}},"logprobs":null,"finish_reason":"{req.finish_reason}"}}]}}\n\n'
            return out
        fr = f'"{req.finish_reason}"' if fin else "null"
        return self.head + '"text":"' + filler_text(sent, n) + f'","logprobs":null,"finish_reason":{fr}}}]}}\n\n'

    def closing(self, include_usage: bool) -> str:
        tail = ""
        if include_usage and self.kind != "generate":
            tail = (self.head.split('"choices"')[0] + '"choices":[],"usage":' +
                    json.dumps(usage(self.req.prompt_tokens, self.req.generated)) + "}\n\n")
        return tail + "data: [DONE]\n\n"
