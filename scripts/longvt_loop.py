"""LongVT's own eval loop, end to end, on paravt's servers (opt-in, not CI; needs .venv-lmms).

lmms-eval 0.7.3's `async_openai` model with `mcp_server_path=` is how LongVT's published evaluation
runs: it lists the MCP server's tools, sends them as OpenAI `tools`, and while a reply's
finish_reason is `tool_calls` runs each call through the MCP server and sends the result back as a
`tool` message (frames as images). Here the model server is `paravt serve` (native tool calling:
the tools through the checkpoint's chat template, the calls read as vLLM's hermes parser reads them)
and the MCP server is the script `paravt mcp --write-script` writes. Per video:

- `paravt mcp --video V --write-script S`: the model's calls carry no `video_path` (paravt's models
  never choose a file), so the server is bound to the question's video;
- a local `--include_path` task of that video's SynthVT-mini questions; its message is the question
  and the video's length as text (lmms-eval appends "Image i has image path: ..." after every image of
  a task's message once MCP is on, and a 1.4 M-parameter toy cannot read past such lines), so the
  frames reach the model through crop_video only; scored with paravt's own scorer;
- `python -m lmms_eval --model async_openai --model_args base_url=SERVE/v1,mcp_server_path=S ...`.

It prints, per question, the calls lmms-eval made (from the response it logged), the frames that came
back, the answer and its score, and writes summary.json.

    .venv-lmms/bin/python scripts/longvt_loop.py [--out runs/longvt_loop] [--n 4]
        [--model src/paravt/assets/paradox-base]

The default model is the shipped `paradox-base`, whose tool habit is LongVT's: one `crop_video` call a
turn in Hermes layout, no think block, a plain answer sentence. `tiny-paravt`, trained with a forced
`<think>\\n` under paravt's tool block, writes no readable call under this prompt.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def server_python() -> Path:
    """The Python that runs `paravt mcp`: the checkout's .venv (paravt[mcp], mcp 2.x) where there is
    one, else this one. lmms-eval's env keeps mcp 1.x for its client, and the server needs 2.x."""
    own = ROOT / ".venv" / "bin" / "python"
    return own if own.exists() else Path(sys.executable)


def run_async_openai(model_args: str, task: str, include: Path, work: Path, hf_home: Path) -> tuple[int, list[dict]]:
    """`python -m lmms_eval --model async_openai` (this Python: lmms-eval's env) on `task`, offline,
    its output in `work/lmms` and its log in `work/lmms_eval.log`: the exit status and the samples it logged."""
    cmd = [sys.executable, "-m", "lmms_eval", "--model", "async_openai", "--model_args", model_args, "--tasks", task,
           "--include_path", str(include), "--output_path", str(work / "lmms"), "--log_samples"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(hf_home))
    print("$ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    (work / "lmms_eval.log").write_text(r.stdout + r.stderr)
    samples = [json.loads(line) for p in glob.glob(str(work / "lmms" / "**" / "*_samples_*.jsonl"), recursive=True)
               for line in Path(p).read_text().splitlines() if line.strip()]
    return r.returncode, samples


TASK = "synthvt_longvt"


def task_yaml(task: str, data: Path, metric: str) -> str:
    """An lmms-eval task over the JSON rows in `data`, its functions in `{task}_utils.py` beside it."""
    return f"""task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_visual: !function {task}_utils.doc_to_visual
doc_to_text: !function {task}_utils.doc_to_text
doc_to_messages: !function {task}_utils.doc_to_messages
doc_to_target: answer
generation_kwargs:
  max_new_tokens: 256
process_results: !function {task}_utils.process_results
metric_list:
  - metric: {metric}
    aggregation: mean
    higher_is_better: true
"""


TASK_UTILS = '''from paravt import protocol as P
from paravt.eval.metrics import score_prediction


def doc_to_visual(doc):
    return []


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return doc["question"]


def doc_to_messages(doc, lmms_eval_specific_kwargs=None):
    text = P.user_prompt_text(doc["question"], doc["duration"], doc["question_type"])
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def final_text(response):
    """The model's last turn: what follows the last tool result in lmms-eval's response string."""
    return response.rsplit("</tool_response>", 1)[-1]


def process_results(doc, results):
    answer = P.extract_answer(final_text(results[0]))
    return {"score": score_prediction(answer, doc["answer"], doc["question_type"], options=doc.get("options") or None)}
'''
CALL = re.compile(r"<tool_call>(\S+) (.*?)</tool_call></tool_response>(.*?)</tool_response>", re.S)


def serve(model: str, port: int, log: Path) -> subprocess.Popen:
    """`paravt serve --model MODEL` under this Python, until it answers /health."""
    proc = subprocess.Popen([sys.executable, "-m", "paravt", "serve", "--model", model, "--port", str(port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"paravt serve exited ({proc.returncode}); see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(1)
    proc.terminate()
    raise SystemExit(f"paravt serve did not come up in 180 s; see {log}")


def questions(out: Path, n: int) -> dict[str, list[dict]]:
    """`n` SynthVT-mini test questions (`paravt synth --n`: two a video), by video."""
    from paravt.eval.benchmarks import load_benchmark

    split = out / "split"
    if not (split / "annotations.jsonl").exists():
        subprocess.run([sys.executable, "-m", "paravt", "synth", "--preset", "mini", "--out", str(split), "--n",
                        str(n), "--split", "test", "--seed", "0"], check=True, capture_output=True)
    from paravt.video import VideoReader

    by_video: dict[str, list[dict]] = {}
    for s in load_benchmark("synthvt", split).samples:
        with VideoReader(s.video_path) as r:
            duration = r.duration
        by_video.setdefault(s.video_path, []).append(
            {"id": s.id, "video": s.video_path, "duration": duration, "question": s.question, "answer": s.answer,
             "question_type": s.question_type, **({"options": s.options} if s.options else {})})
    return by_video


def run_video(out: Path, video: str, rows: list[dict], url: str, model_name: str, server_python: str) -> list[dict]:
    """One lmms-eval run over the questions of one video; what it logged, read back per question."""
    work = out / Path(video).stem
    include = work / "tasks"
    include.mkdir(parents=True, exist_ok=True)
    (work / "data.json").write_text(json.dumps(rows))
    (include / f"{TASK}.yaml").write_text(task_yaml(TASK, work / "data.json", "score"))
    (include / f"{TASK}_utils.py").write_text(TASK_UTILS)
    script = work / "paravt_mcp.py"
    subprocess.run([server_python, "-m", "paravt", "mcp", "--video", video, "--write-script", str(script)],
                   check=True, capture_output=True)  # the script re-executes itself under that Python
    args = (f"model_version={model_name},base_url={url}/v1,api_key=EMPTY,mcp_server_path={script},num_cpus=1,"
            "max_retries=1")
    code, logged = run_async_openai(args, TASK, include, work, out / "hf")
    if len(logged) != len(rows):
        raise SystemExit(f"lmms-eval logged {len(logged)} of {len(rows)} samples (exit {code}); see "
                         f"{work / 'lmms_eval.log'}")
    found = glob.glob(str(work / "lmms" / "**" / "*_results.json"), recursive=True)
    mean = json.loads(Path(found[0]).read_text())["results"][TASK]["score,none"] if found else None
    out_rows = []
    for s in sorted(logged, key=lambda s: s["doc_id"]):
        resp = s["filtered_resps"]
        resp = resp[0] if isinstance(resp, list) else resp
        row = rows[s["doc_id"]]
        calls = [{"name": name, "arguments": args, "frames": result.count("<image_url>"),
                  "result": re.sub(r"(<[\d.]+ seconds><image_url>)+", " [frames] ", result)[:300]}
                 for name, args, result in CALL.findall(resp)]
        out_rows.append({"id": row["id"], "question": row["question"], "truth": row["answer"], "calls": calls,
                         "final": resp.rsplit("</tool_response>", 1)[-1][:300], "score": s["score"],
                         "lmms_eval_mean": mean})
    return out_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/longvt_loop")
    ap.add_argument("--n", type=int, default=4, help="SynthVT-mini questions (two a video: a colour question and "
                    "a background control)")
    ap.add_argument("--model", default=str(ROOT / "src" / "paravt" / "assets" / "paradox-base"))
    ap.add_argument("--port", type=int, default=0, help="paravt serve's port (0: a free one)")
    ap.add_argument("--server-python", default=str(server_python()), help="the Python with paravt[mcp] (mcp 2.x) "
                    "that writes the MCP server script, and so runs it (default: the checkout's .venv; lmms-eval's "
                    "env keeps mcp 1.x for its client)")
    a = ap.parse_args()
    from paravt.procs import free_port

    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    by_video = questions(out, a.n)
    port = a.port or free_port()
    proc = serve(a.model, port, out / "serve.log")
    t = time.perf_counter()
    try:
        name = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"][0]["id"]
        rows = [row for video, qs in by_video.items()
                for row in run_video(out, video, qs, f"http://127.0.0.1:{port}", name, a.server_python)]
    finally:
        proc.terminate()
        proc.wait(30)
    seconds = time.perf_counter() - t
    for row in rows:
        print(f"--- {row['id']}: {row['question']} (truth {row['truth']!r}) score {row['score']:g}")
        for c in row["calls"]:
            print(f"    call {c['name']} {c['arguments']} -> {c['frames']} frames: {c['result'][:120]}")
        print(f"    answer: {row['final'].strip()[:200]}")
    n_frames = sum(c["frames"] for row in rows for c in row["calls"])
    score = sum(row["score"] for row in rows) / len(rows)
    summary = {"model": a.model, "questions": len(rows), "score": score, "calls": sum(len(r["calls"]) for r in rows),
               "frames_back": n_frames, "seconds": round(seconds, 1), "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{len(rows)} questions on {len(by_video)} videos: {summary['calls']} crop_video calls ran, "
          f"{n_frames} frames went back, score {100 * score:.1f} % ({seconds:.0f} s); {out / 'summary.json'}")
    sys.exit(0 if summary["calls"] and n_frames else 1)


if __name__ == "__main__":
    main()
