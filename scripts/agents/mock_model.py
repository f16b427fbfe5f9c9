#!/usr/bin/env python3
"""A scripted model server for scripts/agents-test.sh: real agent CLIs, no model API.

Emulates, on 127.0.0.1, just enough of two wire protocols for an agent to run a task:
  - Anthropic Messages (Claude Code): POST /v1/messages, streamed (SSE) or not, and
    POST /v1/messages/count_tokens;
  - OpenAI Responses (Codex CLI): POST /v1/responses, streamed (SSE).
Every request that offers tools is a turn of the agent's main loop. It is answered from
a fixed script, one tool call per turn, picked by how many tool results the request's
history already holds, with the agent's own tool names (read from the request's tool
list):
  1. list the files (shell `ls -la`),
  2. read the hidden `.env` through the shell (`cat .env`: the fence must answer ENOENT),
  3. edit README.md with the agent's own edit tool (Claude Code: Read then Edit; Codex:
     apply_patch),
  4. edit notes.txt with `sed -i` through the shell,
  5. `git add -A && git commit` through the shell,
  6. a final text answer.
A request without tools (titles, summaries, quota probes) gets a short text answer.

Logs every request, one JSON object a line, to --log: {"method", "path", "body",
"answer"}, the body exactly as received (so the test can check that a hidden file's
contents never reached the model) and one line saying what it answered. Writes the port it listens on to --port-file once it is serving.

Standard library only.
"""

import argparse
import http.server
import json
import os
import threading
import urllib.parse

README_OLD = "Hello from the demo."
NOTES_SED = "sed -i 's/^status: draft$/status: reviewed/' notes.txt"
COMMIT = "git add -A && git commit -q -m 'agent: edit README.md and notes.txt' && git log --oneline -1"
FINAL = "Done: README.md and notes.txt are edited and committed; .env could not be read."


def readme_new(agent):
    return f"Hello from the demo, edited by {agent}."


def step_actions(agent):
    """The script: (kind, argument) per step; kind is shell, read, edit or text."""
    steps = [("shell", "ls -la"), ("shell", "cat .env")]
    if agent == "claude":
        steps.append(("read", "README.md"))  # Claude Code's Edit wants a Read first
    steps += [
        ("edit", "README.md"),
        ("shell", NOTES_SED),
        ("shell", COMMIT),
        ("text", FINAL),
    ]
    return steps


def describe(answer):
    """One short line for the log: `text: ...` or `TOOL: its main argument`."""
    if isinstance(answer, str):
        return "text: " + answer[:60]
    name, args = answer
    if isinstance(args, str):  # a freeform apply_patch
        return f"{name}: " + " ".join(ln for ln in args.splitlines() if ln.startswith("*** U"))
    arg = args.get("command") or args.get("cmd") or args.get("file_path") or args
    return f"{name}: {arg if isinstance(arg, str) else json.dumps(arg)}"


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr, handler, log_path, workspace):
        super().__init__(addr, handler)
        self.log_path = log_path
        self.workspace = workspace
        self.lock = threading.Lock()
        self.ids = 0

    def next_id(self):
        with self.lock:
            self.ids += 1
            return self.ids

    def log(self, record):
        with self.lock, open(self.log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet: the JSON log is the record
        pass

    def send(self, status, body, ctype="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.server.log({"method": "GET", "path": self.path, "body": ""})
        self.send(404, json.dumps({"error": {"type": "not_found", "message": "mock"}}))

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        text = raw.decode("utf-8", "replace")
        self.answer = "-"
        try:
            self.route(text)
        finally:
            self.server.log(
                {"method": "POST", "path": self.path, "body": text, "answer": self.answer}
            )

    def route(self, text):
        path = urllib.parse.urlsplit(self.path).path
        try:
            req = json.loads(text or "{}")
        except ValueError:
            return self.send(400, '{"error":"bad json"}')
        if path.endswith("/messages/count_tokens"):
            self.answer = "count_tokens"
            return self.send(200, json.dumps({"input_tokens": max(1, len(text) // 4)}))
        if path.endswith("/messages"):
            return self.anthropic(req)
        if path.endswith("/responses"):
            return self.openai_responses(req)
        self.send(404, json.dumps({"error": {"type": "not_found", "message": path}}))

    # The script, shared by both protocols.

    def action(self, done, agent):
        steps = step_actions(agent)
        return steps[min(done, len(steps) - 1)]

    def path_in_ws(self, name):
        return os.path.join(self.server.workspace, name)

    # Anthropic Messages.

    def anthropic(self, req):
        tools = {t.get("name") for t in req.get("tools") or []}
        blocks = []
        if {"Bash", "Read", "Edit"} <= tools:
            done = sum(
                1
                for m in req.get("messages", [])
                if isinstance(m.get("content"), list)
                for b in m["content"]
                if b.get("type") == "tool_result"
            )
            kind, arg = self.action(done, "claude")
            if kind == "shell":
                blocks.append(("Bash", {"command": arg, "description": "scripted step"}))
            elif kind == "read":
                blocks.append(("Read", {"file_path": self.path_in_ws(arg)}))
            elif kind == "edit":
                blocks.append(
                    (
                        "Edit",
                        {
                            "file_path": self.path_in_ws(arg),
                            "old_string": README_OLD,
                            "new_string": readme_new("claude"),
                        },
                    )
                )
            else:
                blocks.append(arg)
        else:
            blocks.append("OK")
        n = self.server.next_id()
        model = req.get("model", "mock")
        content = []
        for b in blocks:
            if isinstance(b, str):
                content.append({"type": "text", "text": b})
            else:
                content.append(
                    {"type": "tool_use", "id": f"toolu_mock{n:04d}", "name": b[0], "input": b[1]}
                )
        self.answer = describe(blocks[-1])
        stop = "tool_use" if content[-1]["type"] == "tool_use" else "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 10}
        message = {
            "id": f"msg_mock{n:04d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not req.get("stream"):
            return self.send(200, json.dumps(message))
        events = [("message_start", {"message": dict(message, content=[], stop_reason=None)})]
        for i, c in enumerate(content):
            if c["type"] == "text":
                start = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": c["text"]}
            else:
                start = dict(c, input={})
                delta = {"type": "input_json_delta", "partial_json": json.dumps(c["input"])}
            events.append(("content_block_start", {"index": i, "content_block": start}))
            events.append(("content_block_delta", {"index": i, "delta": delta}))
            events.append(("content_block_stop", {"index": i}))
        events.append(
            (
                "message_delta",
                {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage},
            )
        )
        events.append(("message_stop", {}))
        self.sse(events)

    # OpenAI Responses.

    def openai_responses(self, req):
        tools = {t.get("name"): t for t in req.get("tools") or [] if t.get("name")}
        shell = next((s for s in ("shell_command", "exec_command", "shell") if s in tools), None)
        n = self.server.next_id()
        items = []
        if shell and "apply_patch" in tools:
            done = sum(
                1
                for it in req.get("input", [])
                if it.get("type") in ("function_call_output", "custom_tool_call_output")
            )
            kind, arg = self.action(done, "codex")
            call_id = f"call_mock{n:04d}"
            if kind == "shell":
                if shell == "shell_command":
                    args = {"command": arg, "workdir": self.server.workspace}
                elif shell == "exec_command":
                    args = {"cmd": arg, "workdir": self.server.workspace}
                else:
                    args = {"command": ["bash", "-lc", arg], "workdir": self.server.workspace}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call_id,
                        "name": shell,
                        "arguments": json.dumps(args),
                    }
                )
            elif kind == "edit":
                patch = (
                    f"*** Begin Patch\n*** Update File: {arg}\n@@\n"
                    f"-{README_OLD}\n+{readme_new('codex')}\n*** End Patch\n"
                )
                if tools["apply_patch"].get("type") == "custom":
                    items.append(
                        {"type": "custom_tool_call", "call_id": call_id, "name": "apply_patch",
                         "input": patch}
                    )
                else:
                    items.append(
                        {"type": "function_call", "call_id": call_id, "name": "apply_patch",
                         "arguments": json.dumps({"input": patch})}
                    )
            else:
                items.append(arg)
        else:
            items.append("OK")
        last = items[-1]
        self.answer = describe(
            last if isinstance(last, str)
            else (last["name"], last.get("input") or json.loads(last["arguments"]))
        )
        events = [("response.created", {"response": {"id": f"resp_mock{n:04d}"}})]
        for i, it in enumerate(items):
            if isinstance(it, str):
                it = {
                    "type": "message",
                    "role": "assistant",
                    "id": f"msg_mock{n:04d}_{i}",
                    "content": [{"type": "output_text", "text": it}],
                }
            events.append(("response.output_item.done", {"item": it}))
        usage = {
            "input_tokens": 10,
            "input_tokens_details": None,
            "output_tokens": 10,
            "output_tokens_details": None,
            "total_tokens": 20,
        }
        events.append(
            ("response.completed", {"response": {"id": f"resp_mock{n:04d}", "usage": usage}})
        )
        self.sse(events)

    def sse(self, events):
        out = []
        for name, data in events:
            out.append(f"event: {name}\ndata: {json.dumps(dict(data, type=name))}\n\n")
        self.send(200, "".join(out), "text/event-stream")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", required=True, help="append every request here (JSON lines)")
    ap.add_argument("--port-file", required=True, help="write the port here once serving")
    ap.add_argument("--workspace", required=True, help="the agent's workspace (absolute)")
    a = ap.parse_args()
    srv = Server(("127.0.0.1", 0), Handler, a.log, a.workspace)
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(srv.server_address[1]))
    os.rename(tmp, a.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
