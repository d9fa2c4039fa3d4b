"""A real lmms-eval run whose tool calls go through `paravt mcp` (opt-in, not CI; needs .venv-lmms).

lmms-eval's `async_openai` model with `mcp_server_path=` runs its own tool loop: it declares the MCP
server's tools to an OpenAI-compatible server, and while the answer's finish_reason is `tool_calls`
it runs each call through a fresh `python SERVER_PATH` process and sends the results back as `tool`
messages. Here:
- the server script is `paravt mcp --write-script`, bound to a media root of SynthVT-mini videos;
- the model is scripted (the shape of a model served with native tool calls, as vLLM's
  `--enable-auto-tool-choice --tool-call-parser hermes` answers): first turn, a crop_video and a
  watch_window call on the video path lmms-eval wrote into the prompt; once tool results are there,
  an answer naming what they held (scripts/longvt_loop.py runs the loop with `paravt serve` and a
  shipped model instead);
- the task is a local `--include_path` task of SynthVT-mini questions whose message holds the video.

It prints what lmms-eval logged per sample (its response string records each call and the text of its
result) and checks that the calls ran through paravt's server.

    .venv-lmms/bin/python scripts/lmms_eval_mcp.py [--out runs/lmms_eval_mcp] [--n 2] [--no-video]
        [--server-python .venv/bin/python]

--no-video: the task's message holds the path as text (the line lmms-eval writes after a video) instead of
a video element; the default where qwen_vl_utils, which lmms-eval decodes a video element with, does not
import (it needs torchvision: not in .venv-lmms on a CPU torch).
--server-python: the server script runs under that Python (the written script re-executes itself
under the interpreter that wrote it), e.g. paravt's own .venv beside lmms-eval's.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # its neighbour, however it is loaded
from longvt_loop import run_async_openai, server_python, task_yaml  # noqa: E402

TASK_UTILS = '''
def doc_to_visual(doc):
    return [doc["video"]]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return doc["question"]


def doc_to_messages(doc, lmms_eval_specific_kwargs=None):
    """As LongVT's tool task: the video, then the question."""
    content = [{{"type": "text", "text": doc["question"] + " Call crop_video or watch_window if needed."}}]
    {video_line}
    return [{{"role": "user", "content": content}}]


def process_results(doc, results):
    # 1 when the response shows a crop_video result written by paravt's server
    return {{"called_paravt": float("Frames of " in results[0] and "seconds>" in results[0])}}
'''


class ScriptedToolModel:
    """An OpenAI-compatible /v1/chat/completions that answers with native tool calls."""

    def __init__(self, log: Path):
        self.log = log
        model = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self._send(model.reply(body))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @staticmethod
    def _texts(m: dict) -> list[str]:
        c = m.get("content")
        if isinstance(c, str):
            return [c]
        return [p.get("text", "") for p in c or [] if isinstance(p, dict) and p.get("type") == "text"]

    def reply(self, body: dict) -> dict:
        msgs = body["messages"]
        tool_msgs = [m for m in msgs if m.get("role") == "tool"]
        texts = [t for m in msgs for t in self._texts(m)]
        with self.log.open("a") as f:  # what the model was sent: roles, texts, image counts
            f.write(json.dumps({"tools": [t["function"]["name"] for t in body.get("tools", [])], "messages": [
                {"role": m.get("role"), "name": m.get("name"), "texts": [t[:300] for t in self._texts(m)],
                 "images": sum(1 for p in m.get("content") or [] if isinstance(p, dict) and p.get("type") == "image_url")}
                for m in msgs]}) + "\n")
        if not tool_msgs:
            path = next((m.group(1) for t in texts for m in [re.search(r"has video path: (\S+)", t)] if m), None)
            question = texts[0].split(" Call crop_video")[0] if texts else ""
            if path and body.get("tools"):
                calls = [("crop_video", {"video_path": path, "start_time": 10, "end_time": 16}),
                         ("watch_window", {"video_path": path, "start_time": 0, "end_time": 32, "question": question})]
                return self._choice("Looking closer at two windows.", [
                    {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                    for i, (n, a) in enumerate(calls)])
            return self._choice("No video path or no tools: no answer.")
        seen = " | ".join(t[:120] for m in tool_msgs for t in self._texts(m)[:1])
        return self._choice(f"<answer>From the tools: {seen}</answer>")

    @staticmethod
    def _choice(content: str, tool_calls: list | None = None) -> dict:
        msg = {"role": "assistant", "content": content}
        if tool_calls:
            msg["tool_calls"] = tool_calls
        return {"id": "x", "object": "chat.completion", "model": "scripted", "choices": [
            {"index": 0, "message": msg, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}

    def __enter__(self) -> "ScriptedToolModel":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()


def make_task(out: Path, n: int, with_video: bool) -> tuple[Path, Path]:
    """(media root, include dir): n SynthVT-mini videos and their colour questions as a local task."""
    from paravt.synth.dataset import MINI_TASK
    from paravt.synth.render import make_spec, write_video

    media, include = out / "media", out / "tasks"
    include.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in range(n):
        spec = make_spec(seed, min_len=MINI_TASK["min_len"], max_len=MINI_TASK["max_len"],
                         n_events=MINI_TASK["n_events"], event_len=(MINI_TASK["event_min"], MINI_TASK["event_max"]))
        video = write_video(spec, media / f"synth_{seed}.mp4")
        e = spec.events[0]
        rows.append({"id": str(seed), "video": str(video), "question": f"What colour was the {e.shape}?",
                     "answer": e.colour})
    (out / "data.json").write_text(json.dumps(rows))
    (include / "synthvt_mcp.yaml").write_text(task_yaml("synthvt_mcp", out / "data.json", "called_paravt"))
    # without a video element (--no-video) the path is written as lmms-eval writes it after a video's frames
    video_line = ('content.insert(0, {"type": "video", "url": doc["video"]})' if with_video else
                  'content.append({"type": "text", "text": "\\nVideo 0 has video path: " + doc["video"]})')
    (include / "synthvt_mcp_utils.py").write_text(TASK_UTILS.format(video_line=video_line))
    return media, include


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/lmms_eval_mcp")
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--server-python", default=str(server_python()), help="the Python with paravt[mcp] (mcp 2.x) "
                    "that writes the server script, and so runs it (default: the checkout's .venv)")
    ap.add_argument("--no-video", action="store_true", help="give the path as text only, not as a video element "
                    "(lmms-eval then decodes nothing client-side; it needs qwen_vl_utils to)")
    a = ap.parse_args()
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with_video = not a.no_video
    try:
        import qwen_vl_utils  # noqa: F401  (what lmms-eval decodes a video element with)
    except ImportError as e:
        print(f"no video element: lmms-eval could not decode it here ({e}); the path goes as text", flush=True)
        with_video = False
    media, include = make_task(out, a.n, with_video)
    script = out / "paravt_mcp_server.py"
    subprocess.run([a.server_python, "-m", "paravt", "mcp", "--media-root", str(media), "--frames", "4",
                    "--write-script", str(script)], check=True)
    log = out / "model_requests.jsonl"
    log.unlink(missing_ok=True)
    with ScriptedToolModel(log) as model:
        args = (f"model_version=scripted,base_url={model.url},api_key=EMPTY,mcp_server_path={script},num_cpus=1,"
                "nframes=4,max_pixels=50176")
        code, samples = run_async_openai(args, "synthvt_mcp", include, out, out / "hf")
    if not samples:
        sys.exit(f"lmms-eval logged no samples (exit {code}); see {out / 'lmms_eval.log'}")
    for s in sorted(samples, key=lambda s: s["doc_id"]):
        resp = s["filtered_resps"]
        resp = resp[0] if isinstance(resp, list) else resp
        print(f"--- doc {s['doc_id']}: called_paravt={s.get('called_paravt')}\n{resp[:1500]}")
    ok = sum(s.get("called_paravt", 0) for s in samples)
    print(f"\n{ok:g} of {len(samples)} samples show crop_video results written by paravt's MCP server; "
          f"the model's requests are in {log}")
    sys.exit(0 if ok == len(samples) else 1)


if __name__ == "__main__":
    main()
