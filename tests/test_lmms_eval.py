"""paravt inside lmms-eval (opt-in, never in CI): `python -m lmms_eval --model paravt` scored by lmms-eval's
own task code, compared with paravt's own scoring.

Runs in the virtualenv `make lmms-eval-env` builds (lmms-eval 0.7.3 beside paravt):

    .venv-lmms/bin/python -m pytest -m lmms_eval tests/test_lmms_eval.py

Elsewhere (no lmms-eval importable) the module is skipped with that command as the reason. Every
lmms-eval run is a subprocess (`python -m lmms_eval ...`, offline); models: the shipped tiny model
in-process, or a scripted OpenAI-compatible server on loopback whose main agent crops twice, then
answers with a text chosen per question (the outputs the scorers are compared on).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

try:
    import lmms_eval  # noqa: F401
except ImportError:
    pytest.skip("lmms-eval is not installed in this Python: build .venv-lmms with `make lmms-eval-env`, then run "
                "`.venv-lmms/bin/python -m pytest -m lmms_eval tests/test_lmms_eval.py`", allow_module_level=True)

import pyarrow.parquet as pq

from paravt import protocol as P
from paravt.eval.benchmarks import BENCHMARKS, load_benchmark
from paravt.eval.metrics import score_prediction, summarize
from paravt.integrations.lmms_eval import (NO_ANSWER, Settings, question_type_of, response_of, truth_of)
from paravt.rewards import mcq_letter, options_from_question
from paravt.synth.render import make_spec, write_video

pytestmark = pytest.mark.lmms_eval

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "eval"
TASKS = Path(lmms_eval.__file__).parent / "tasks"
SEVEN = ("videomme", "videomme_w_subtitle", "longvideobench_val_v", "lvbench", "mlvu_dev", "mmvu_val",
         "temporal_grounding_charades")


# ---- running lmms-eval --------------------------------------------------------------------------


def run_lmms_eval(tmp: Path, name: str, tasks: str, model_args: str, include: Path, hf_home: Path,
                  *extra: str) -> dict:
    """`python -m lmms_eval --model paravt ... --log_samples` into tmp/name; returns its results.json
    and {task: [logged samples in doc order]}. lmms-eval exits 0 after an error too: the results
    file must exist."""
    out = tmp / name
    env = dict(os.environ, HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "lmms_eval", "--model", "paravt", "--model_args", model_args, "--tasks", tasks,
           "--include_path", str(include), "--output_path", str(out), "--log_samples", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    found = glob.glob(str(out / "**" / "*_results.json"), recursive=True)
    assert r.returncode == 0 and found, r.stdout[-6000:] + r.stderr[-6000:]
    samples = {}
    for path in glob.glob(str(out / "**" / "*_samples_*.jsonl"), recursive=True):
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        samples[Path(path).stem.split("_samples_", 1)[1]] = sorted(rows, key=lambda x: x["doc_id"])
    return {"results": json.loads(Path(found[0]).read_text()), "samples": samples, "out": out}


def trace_rows(out: Path, task: str) -> dict[str, dict]:
    path = out / "paravt_traces" / task / "results.jsonl"
    return {json.loads(line)["id"]: json.loads(line) for line in path.read_text().splitlines()}


class ScriptedServer:
    """An OpenAI-compatible /v1/chat/completions on loopback. Main agent, first turn: two crop_video
    calls (when the tool is declared); after the tool responses (or without the tool): the answer
    scripted for the question its prompt contains. Sub-agents: a one-line summary. A question
    scripted with None gets HTTP 400 (a failing model)."""

    def __init__(self, answers: dict[str, str | None]):
        self.answers = answers
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                text = server.reply(body["messages"])
                if text is None:
                    return self._send(400, {"error": {"message": "scripted failure"}})
                self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                              "finish_reason": "stop"}],
                                 "usage": {"prompt_tokens": 10, "completion_tokens": 5}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @staticmethod
    def _text(m: dict) -> str:
        c = m.get("content")
        return c if isinstance(c, str) else "".join(p.get("text", "") for p in c or [] if isinstance(p, dict))

    def reply(self, messages: list[dict]) -> str | None:
        texts = [self._text(m) for m in messages]
        if any("These frames come from a video between" in t for t in texts):
            return "A person is in a room; nothing else changes."
        answered = next((a for q, a in self.answers.items() if any(q in t for t in texts)), "no idea")
        if answered is None:
            return None
        tool = any(P.TOOL_NAME in t for m, t in zip(messages, texts) if m["role"] == "system")
        first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
        responded = any("tool_response" in t for t in texts[first_user + 1:])
        if tool and not responded:
            return ("the overview is not enough, look at two windows</think>\n" + P.format_tool_call(0, 5) + "\n"
                    + P.format_tool_call(5, 10))
        return f"I have what I need.</think>\n<answer>{answered}</answer>"

    def __enter__(self) -> "ScriptedServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---- local data in the benchmarks' own schemas ----------------------------------------------------

VMME_ROWS = pq.read_table(FIX / "videomme" / "videomme" / "test-00000-of-00001.parquet").to_pylist()
CHARADES_LINES = (FIX / "charades" / "charades_sta_test.txt").read_text().splitlines()[:8]

# What the scripted model answers (the <answer> body) per Video-MME question: outputs a model writes.
VMME_ANSWERS = {
    "001-1": "C",  # truth C
    "001-2": "It could be A or B.",  # truth A
    "001-3": "The answer is (D).",  # truth D
    "002-1": "E",  # truth C; four options
    "336-1": "Investing in a diverse range of companies through a low-cost index fund.",  # truth B, its text
    "658-2": "B. Zirconium.",  # truth B
}
# lmms-eval's Video-MME verdicts on those answers as written (answer=raw): correct?
VMME_RAW_LMMS = {"001-1": 1, "001-2": 0, "001-3": 1, "002-1": 0, "336-1": 0, "658-2": 1}
# ... and paravt's on the same answers
VMME_PARAVT = {"001-1": 1, "001-2": 0, "001-3": 1, "002-1": 0, "336-1": 1, "658-2": 1}

CHARADES_ANSWERS = [  # one per fixture line, in order
    "The event happens in the 24.3 - 30.4 seconds.",
    "From 20 to 28 seconds.",
    "00:25 - 00:31",
    "It starts at 22 and ends at 30 seconds.",
    "4.3-12.5",
    "I cannot tell.",
    "0 - 3.4",
    "between 1 and 4 seconds",
]


def write_videos(names: list[str], where: Path, seconds: tuple[float, float] = (36, 40)) -> None:
    where.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(dict.fromkeys(names)):
        write_video(make_spec(100 + i, min_len=seconds[0], max_len=seconds[1]), where / name)


@pytest.fixture(scope="module")
def bench_tasks(tmp_path_factory):
    """Local copies of lmms-eval's own videomme and charades tasks: the installed task yamls included
    (their doc_to_visual, doc_to_text, process_results and aggregation), only the dataset pointed at
    local files in the published schema; videos generated under the names the tasks look for."""
    tmp = tmp_path_factory.mktemp("bench")
    hf, include = tmp / "hf", tmp / "tasks"
    include.mkdir()
    write_videos([r["videoID"] + ".mp4" for r in VMME_ROWS], hf / "videomme" / "data")
    docs = []
    for line in CHARADES_LINES:
        head, _, sentence = line.partition("##")
        vid, s, e = head.split()
        docs.append({"video": f"{vid}.mp4", "caption": sentence.strip().rstrip("."), "timestamp": [float(s), float(e)]})
    write_videos([d["video"] for d in docs], hf / "charades_sta" / "Charades_v1_480")
    (tmp / "charades.json").write_text(json.dumps(docs))
    vmme = FIX / "videomme" / "videomme" / "test-00000-of-00001.parquet"
    (include / "videomme_local.yaml").write_text(
        f"include: {TASKS / 'videomme' / 'videomme.yaml'}\ntask: videomme_local\ndataset_path: parquet\n"
        f"dataset_kwargs:\n  data_files:\n    test: {vmme}\n  cache_dir: videomme\n  video: True\n")
    (hf / "videomme" / "subtitle").mkdir()
    srt = FIX / "videomme" / "subtitle" / "fFjv93ACGo8.srt"
    (hf / "videomme" / "subtitle" / srt.name).write_bytes(srt.read_bytes())
    (include / "videomme_w_subtitle_local.yaml").write_text(
        f"include: {TASKS / 'videomme' / 'videomme_w_subtitle.yaml'}\ntask: videomme_w_subtitle_local\n"
        f"dataset_path: parquet\ndataset_kwargs:\n  data_files:\n    test: {vmme}\n  cache_dir: videomme\n"
        "  video: True\n")
    (include / "charades_local.yaml").write_text(
        f"include: {TASKS / 'charades_sta' / 'charades.yaml'}\ntask: charades_local\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp / 'charades.json'}\n  cache_dir: charades_sta\n"
        "  video: True\n")
    return {"tmp": tmp, "hf": hf, "include": include, "charades_docs": docs}


def scripted_answers(docs: list[dict]) -> dict[str, str]:
    answers = {r["question"]: VMME_ANSWERS[r["question_id"]] for r in VMME_ROWS}
    # the task's prompt quotes "person turn a light on" as its example: key on the sentence it asks about
    answers.update({f"textual sentence: {d['caption']}.": a for d, a in zip(docs, CHARADES_ANSWERS)})
    return answers


# ---- the model args, the prompts of the seven tasks, the responses --------------------------------


def test_model_args_are_checked():
    assert Settings.from_model_args({"frames": 4, "mode": "sequential", "endpoints": "http://a:1|http://b:2"}
                                    ).endpoint_list() == "http://a:1,http://b:2"
    assert Settings.from_model_args({"mode": "none", "traces": "none"}) == Settings(mode="none", traces=None)
    with pytest.raises(ValueError, match="unknown model arg.*frame.*known: model"):
        Settings.from_model_args({"frame": 4})
    with pytest.raises(ValueError, match="frames='many' is not a int"):
        Settings.from_model_args({"frames": "many"})
    with pytest.raises(ValueError, match="answer must be one of letter, raw"):
        Settings.from_model_args({"answer": "text"})
    from paravt.integrations.lmms_eval import ParaVT
    from paravt.models import ModelLoadError

    with pytest.raises(ModelLoadError):
        ParaVT(model="/nonexistent/checkpoint")
    with pytest.raises(ValueError, match="mode must be one of"):
        ParaVT(mode="fast")


def _task_kwargs(task_dir: str, yaml_name: str) -> dict:
    from lmms_eval.utils import load_yaml_config

    cfg = load_yaml_config(str(TASKS / task_dir / yaml_name), mode="simple")
    return dict(cfg.get("lmms_eval_specific_kwargs", {}).get("default", {}))


def test_the_seven_tasks_exist_and_their_prompts_read_as_paravt_questions():
    """Each task's own doc_to_text on a document in its dataset's schema: paravt reads the question
    type the task scores and the options the task lists."""
    from lmms_eval.tasks import TaskManager

    tm = TaskManager("ERROR")
    assert all(t in tm.all_tasks for t in SEVEN)
    from lmms_eval.tasks.charades_sta import utils as charades
    from lmms_eval.tasks.longvideobench import utils as lvb
    from lmms_eval.tasks.lvbench import utils as lvbench
    from lmms_eval.tasks.mlvu import utils as mlvu
    from lmms_eval.tasks.mmvu import utils as mmvu
    from lmms_eval.tasks.videomme import utils as videomme

    cases = [
        ("videomme", videomme.videomme_doc_to_text(VMME_ROWS[0], _task_kwargs("videomme", "videomme.yaml")),
         "mcq", ["Apples.", "Candles.", "Berries.", "The three kinds are of the same number."]),
        ("longvideobench_val_v", lvb.longvideobench_doc_to_text(
            {"question": "What is on the table?", "option0": "a cup", "option1": "a book", "option2": "a pen",
             "option3": "a lamp", "option4": "N/A"}, _task_kwargs("longvideobench", "longvideobench_val_v.yaml")),
         "mcq", ["a cup", "a book", "a pen", "a lamp"]),
        ("lvbench", lvbench.lvbench_doc_to_text({"question": "Who enters first?", "options": ["a man", "a dog", "a cat",
                                                                                             "nobody"]},
                                                _task_kwargs("lvbench", "lvbench.yaml")),
         "mcq", ["a man", "a dog", "a cat", "nobody"]),
        ("mlvu_dev", mlvu.mlvu_doc_to_text({"question": "What does the man hold?\n(A) a cup\n(B) a book\n(C) a pen\n"
                                                        "(D) a lamp"}, _task_kwargs("mlvu", "mlvu_dev.yaml")),
         "mcq", ["a cup", "a book", "a pen", "a lamp"]),
        ("mmvu_val", mmvu.mmvu_doc_to_text({"question_type": "multiple-choice", "question": "Which law?",
                                            "choices": {"A": "Ohm", "B": "Hooke", "C": "Newton", "D": "Snell",
                                                        "E": "Boyle"}}),
         "mcq", ["Ohm", "Hooke", "Newton", "Snell", "Boyle"]),
        ("mmvu_val", mmvu.mmvu_doc_to_text({"question_type": "open-ended", "question": "Which law is shown?",
                                            "choices": {}}), "oe", None),
        ("temporal_grounding_charades", charades.temporal_grounding_doc_to_text(
            {"caption": "person turn a light on"}, _task_kwargs("charades_sta", "charades.yaml")), "tvg", None),
    ]
    for task, prompt, qtype, options in cases:
        assert question_type_of(task, prompt) == qtype, (task, prompt)
        if qtype == "mcq":
            assert options_from_question(prompt) == options, (task, prompt)


def test_what_goes_back_to_lmms_eval():
    row = {"prediction": "The answer is (B).", "parsed": "B", "error": None}
    assert response_of(row, "mcq") == "B"
    assert response_of(row, "mcq", "raw") == "The answer is (B)."
    assert response_of({**row, "parsed": None}, "mcq") == NO_ANSWER
    assert response_of({**row, "error": "BackendError: gone"}, "mcq") == NO_ANSWER
    assert response_of({"prediction": None, "parsed": None}, "oe") == NO_ANSWER
    assert response_of({"prediction": "12.5 to 20", "parsed": [12.5, 20.0]}, "tvg") == "12.5 - 20"
    assert response_of({"prediction": "a red circle", "parsed": "a red circle"}, "oe") == "a red circle"
    assert truth_of({"answer": "C"}, "mcq", ["A. x", "B. y", "C. z"]) == "C"
    assert truth_of({"correct_choice": 1}, "mcq", ["A. x", "B. y"]) == "B"
    assert truth_of({"timestamp": "[24.3, 30.4]"}, "tvg", []) == "[24.3, 30.4]"
    assert truth_of({"question": "?"}, "mcq", ["A. x", "B. y"]) == ""


def test_no_answer_is_no_answer_to_any_task():
    """NO_ANSWER scores wrong under each task's extraction; the empty string would not under MMVU's
    open-ended rule (`prediction in reference`)."""
    from lmms_eval.tasks._task_utils.mcq_extract import extract_mcq_answer
    from lmms_eval.tasks.charades_sta.utils import extract_time
    from lmms_eval.tasks.mmvu.utils import evaluate_with_rule_based

    oe = {"question_type": "open-ended", "answer": "Depth-first search", "choices": {}}
    mc = {"question_type": "multiple-choice", "answer": "A", "choices": {"A": "x", "B": "y"}}
    assert extract_mcq_answer(NO_ANSWER, choices=list("ABCD")) == ""
    assert extract_time(NO_ANSWER) == []
    assert not evaluate_with_rule_based(oe, NO_ANSWER) and not evaluate_with_rule_based(mc, NO_ANSWER)
    assert evaluate_with_rule_based(oe, "")  # why not ""


# ---- the two scorers on the same outputs (docs/lmms_eval.md) --------------------------------------

FOUR = ["A. a red circle", "B. a blue square", "C. a green star", "D. a white cross"]
# (answer as written, paravt's letter, lmms-eval's extract_mcq_answer (Video-MME, LVBench, MLVU),
#  LongVideoBench's parse (None: its random letter), MMVU's rule-based letter, Video-MME's official script)
DIFFERENCES = [
    ("B", "B", "B", "B", "B", "B"),
    ("(B)", "B", "B", "B", "B", "B"),
    ("The answer is B.", "B", "B", "B", "B", "B"),
    ("B. a blue square", "B", "B", "B", "B", "B"),
    ("I think it is C.", "C", "C", "C", "C", "C"),
    ("It could be A or B.", None, "B", "A", "A", "A"),
    ("The answer is B, not C.", "B", "C", "B", "B", "B"),
    ("Option C is wrong, the answer is D", "D", "D", "C", "C", "C"),
    ("Answer: D", "D", "D", "A", "D", "A"),
    ("Both A and C look right", None, "C", "B", "A", "B"),
    ("a blue square", "B", "", None, "A", ""),
    ("b", "B", "", None, "B", ""),
    ("E", None, "", "E", "E", ""),
    ("I am not sure.", None, "", None, None, ""),
]


def _videomme_official(s: str) -> str:
    """Video-MME's evaluation/eval_your_results.py extraction, restated (its prefix list runs some strings
    together, so only the first four and the fifth-sixth joined are removed): first A-D after them."""
    import re

    for p in ("The best answer is", "The correct answer is", "The answer is", "The answer",
              "The best option isThe correct option is", "Best answer:Best option:"):
        s = s.replace(p, "")
    if len(s.split()) > 10 and not re.search("[ABCD]", s):
        return ""
    m = re.search(r"[ABCD]", s)
    return m[0] if m else ""


@pytest.mark.parametrize("text, ours, lmms, lvb, mmvu, official", DIFFERENCES)
def test_the_scorers_differences_table(text, ours, lmms, lvb, mmvu, official):
    import re

    from lmms_eval.tasks._task_utils.mcq_extract import extract_mcq_answer
    from lmms_eval.tasks.longvideobench.utils import parse_multi_choice_response

    assert mcq_letter(text, FOUR) == ours
    assert extract_mcq_answer(text, choices=list("ABCD")) == lmms
    lvb_reads = {parse_multi_choice_response(text, list("ABCD"), {}) for _ in range(40)}
    assert lvb_reads == ({lvb} if lvb else set("ABCD"))  # unreadable: a random letter each time
    m = re.search(r"\b([A-E])\b", text, re.IGNORECASE)  # MMVU's rule-based letter (mmvu/utils.py, method 1)
    assert (m.group(1).upper() if m else None) == mmvu
    assert _videomme_official(text) == official
    assert f"`{text}`" in (ROOT / "docs" / "lmms_eval.md").read_text()  # the docs' table holds every case


# ---- (a) a local task: lmms-eval's score equals paravt eval's, sample by sample ------------------


def test_local_synthvt_task_scores_as_paravt_eval(tmp_path):
    """SynthVT MCQ items as a JSON dataset of an --include_path task; the shipped tiny model in-process,
    K = 4, greedy, one episode at a time in both: the same episodes, the same scores per sample."""
    split = tmp_path / "split"
    subprocess.run([sys.executable, "-m", "paravt", "synth", "--out", str(split), "--n", "6", "--split", "test",
                    "--seed", "0", "--kinds", "colour,shape", "--control", "mcq", "--min-len", "60", "--max-len", "80",
                    "--per-video", "3"], check=True, capture_output=True)
    samples = load_benchmark("synthvt", split).samples
    assert len(samples) == 6 and all(s.question_type == "mcq" for s in samples)
    data = tmp_path / "synthvt_mcq.json"
    data.write_text(json.dumps([{"id": s.id, "video": s.video_path, "question": s.question, "answer": s.answer}
                                for s in samples]))
    include = tmp_path / "tasks"
    include.mkdir()
    (include / "synthvt_mcq.yaml").write_text(
        f"task: synthvt_mcq\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        "output_type: generate_until\ndoc_to_visual: !function synthvt_utils.doc_to_visual\n"
        "doc_to_text: !function synthvt_utils.doc_to_text\ndoc_to_target: answer\n"
        "process_results: !function synthvt_utils.process_results\n"
        "metric_list:\n  - metric: accuracy\n    aggregation: mean\n    higher_is_better: true\n")
    (include / "synthvt_utils.py").write_text(
        "from lmms_eval.tasks._task_utils.mcq_extract import extract_mcq_answer\n\n"
        "def doc_to_visual(doc):\n    return [doc['video']]\n\n"
        "def doc_to_text(doc, lmms_eval_specific_kwargs=None):\n    return doc['question']\n\n"
        "def process_results(doc, results):\n"
        "    return {'accuracy': float(extract_mcq_answer(results[0], choices=list('ABCD')) == doc['answer'])}\n")

    ours = tmp_path / "paravt_eval"
    r = subprocess.run([sys.executable, "-m", "paravt", "eval", "--bench", "synthvt", "--data", str(split),
                        "--frames", "4", "--concurrency", "1", "--out", str(ours)], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    theirs = run_lmms_eval(tmp_path, "lmms", "synthvt_mcq", "frames=4,concurrency=1", include, tmp_path / "hf")

    paravt_rows = {r["id"]: r for r in map(json.loads, (ours / "results.jsonl").read_text().splitlines())}
    traces = trace_rows(theirs["out"], "synthvt_mcq")
    logged = theirs["samples"]["synthvt_mcq"]
    assert len(logged) == 6
    for doc in logged:
        sid = samples[doc["doc_id"]].id
        mine, trace = paravt_rows[sid], traces[str(doc["doc_id"])]
        assert trace["prediction"] == mine["prediction"]  # the same episode
        assert trace["episode"]["turns"][0]["generation"]["text"] == mine["episode"]["turns"][0]["generation"]["text"]
        assert doc["accuracy"] == mine["score"], (sid, mine["prediction"], doc["filtered_resps"])
    lmms_acc = theirs["results"]["results"]["synthvt_mcq"]["accuracy,none"]
    paravt_acc = json.loads((ours / "summary.json").read_text())["accuracy"] / 100
    assert lmms_acc == pytest.approx(paravt_acc)
    print(f"\nSynthVT MCQ, tiny model, K=4: lmms-eval {100 * lmms_acc:.1f} %, paravt eval {100 * paravt_acc:.1f} %; "
          "answers: " + "; ".join(repr(paravt_rows[s.id]["prediction"]) for s in samples))


# ---- (b) lmms-eval's own Video-MME and Charades-STA task code --------------------------------------


def paravt_scores(task_samples: list[dict], bench: str, data: Path, videos: Path) -> list[dict]:
    """paravt's metric (its own benchmark loader's truth and options, `score_prediction`) over the
    responses lmms-eval logged, one row per document, in doc order."""
    loaded = load_benchmark(bench, data, videos=videos).samples
    if bench == "videomme":
        by_id = {s.id: s for s in loaded}
        ours = [by_id[VMME_ROWS[d["doc_id"]]["question_id"]] for d in task_samples]
    else:  # Charades-STA: one sample per fixture line, in line order
        ours = [loaded[d["doc_id"]] for d in task_samples]
    rows = []
    for doc, s in zip(task_samples, ours):
        text = doc["filtered_resps"] if isinstance(doc["filtered_resps"], str) else doc["filtered_resps"][0]
        rows.append({"question_type": s.question_type, "extras": s.extras,
                     "score": score_prediction(text, s.answer, s.question_type, options=s.options)})
    return rows


def test_lmms_eval_task_code_scores_paravt_answers_as_paravt_does(bench_tasks):
    """Video-MME (with and without subtitles) and Charades-STA through lmms-eval's own task code
    (doc_to_visual, doc_to_text, process_results, aggregation), the model behind a server: with paravt's
    answers (answer=letter) each task's score equals paravt's metric, sample by sample; with the answers as
    written (answer=raw) lmms-eval's verdicts differ where docs/lmms_eval.md says."""
    t = bench_tasks
    vmme_videos, charades_videos = t["hf"] / "videomme" / "data", t["hf"] / "charades_sta" / "Charades_v1_480"
    tasks = "videomme_local,videomme_w_subtitle_local,charades_local"
    with ScriptedServer(scripted_answers(t["charades_docs"])) as server:
        args = f"model={server.url},frames=4,concurrency=2"
        letter = run_lmms_eval(t["tmp"], "letter", tasks, args, t["include"], t["hf"])
        raw = run_lmms_eval(t["tmp"], "raw", "videomme_local,charades_local", args + ",answer=raw", t["include"],
                            t["hf"])
    res = letter["results"]["results"]

    # every episode cropped twice, each crop summarised by its sub-agent
    for task in tasks.split(","):
        for row in trace_rows(letter["out"], task).values():
            assert row["error"] is None and row["n_executed"] == 2, row
            assert all(c["generation"] for c in row["episode"]["turns"][0]["calls"])
    # the subtitles the task puts in its prompt reach the main agent
    sub = trace_rows(letter["out"], "videomme_w_subtitle_local")["0"]["episode"]["question"]
    assert "This video's subtitles are listed below" in sub and "constructed caption one" in sub

    for task in ("videomme_local", "videomme_w_subtitle_local"):
        vm = letter["samples"][task]
        ours = paravt_scores(vm, "videomme", FIX / "videomme", vmme_videos)
        assert [d["videomme_perception_score"]["score"] for d in vm] == [r["score"] for r in ours]
        assert {VMME_ROWS[d["doc_id"]]["question_id"]: r["score"] for d, r in zip(vm, ours)} == VMME_PARAVT
        summary = summarize(ours, BENCHMARKS["videomme"].breakdowns)
        assert res[task]["videomme_perception_score,none"] == pytest.approx(summary["accuracy"])
        traces = trace_rows(letter["out"], task)  # the traces' own rows score the same
        assert [traces[str(d["doc_id"])]["score"] for d in vm] == [r["score"] for r in ours]

    raw_vm = raw["samples"]["videomme_local"]
    assert {VMME_ROWS[d["doc_id"]]["question_id"]: d["videomme_perception_score"]["score"]
            for d in raw_vm} == VMME_RAW_LMMS

    ch = letter["samples"]["charades_local"]
    s = summarize(paravt_scores(ch, "charades", FIX / "charades", charades_videos))
    assert res["charades_local"]["charades_sta_mIOU,none"] == pytest.approx(s["miou"])
    for k in ("3", "5", "7"):
        assert res["charades_local"][f"charades_sta_IOU@{k},none"] == pytest.approx(s[f"r@0.{k}"])
    raw_ch = raw["results"]["results"]["charades_local"]["charades_sta_mIOU,none"]
    raw_ours = summarize(paravt_scores(raw["samples"]["charades_local"], "charades", FIX / "charades",
                                       charades_videos))["miou"]
    print(f"\nVideo-MME (6 rows): lmms-eval {res['videomme_local']['videomme_perception_score,none']:.1f} = paravt "
          f"{summary['accuracy']:.1f} (answer=letter); on the answers as written: lmms-eval "
          f"{raw['results']['results']['videomme_local']['videomme_perception_score,none']:.1f}. Charades-STA "
          f"({len(ch)} queries): mIoU lmms-eval {res['charades_local']['charades_sta_mIOU,none']:.2f} = paravt "
          f"{s['miou']:.2f}; as written: lmms-eval {raw_ch:.2f}, paravt {raw_ours:.2f}")
    assert raw_ours == pytest.approx(s["miou"]) and raw_ch < raw_ours  # "starts at 22 and ends at 30": unread


def test_dispatch_modes_and_failures_inside_lmms_eval(bench_tasks):
    """The same task in the other dispatch modes; a model error on one question and a document whose video
    is missing are that sample's error (NO_ANSWER, a row in the traces), not the run's."""
    t = bench_tasks
    answers = scripted_answers(t["charades_docs"])
    answers[VMME_ROWS[1]["question"]] = None  # the server fails on 001-2
    with ScriptedServer(answers) as server:
        base = f"model={server.url},frames=4,concurrency=2,timeout=20"
        runs = {mode: run_lmms_eval(t["tmp"], f"mode_{mode}", "videomme_local", f"{base},mode={mode}", t["include"],
                                    t["hf"], "--limit", "3") for mode in ("sequential", "inline", "none")}
    for mode, run in runs.items():
        rows = trace_rows(run["out"], "videomme_local")
        ok = [rows["0"], rows["2"]]
        if mode == "sequential":  # one call runs, the other is answered "not run"
            assert all([c["status"] for c in r["episode"]["turns"][0]["calls"]] == ["ok", "skipped"] for r in ok)
        elif mode == "inline":  # the crops' frames go to the main agent: no sub-agent
            assert all(r["n_executed"] == 2 and not any(c["generation"] for c in r["episode"]["turns"][0]["calls"])
                       for r in ok)
        else:
            assert all(r["n_executed"] == 0 and r["prediction"] == VMME_ANSWERS[VMME_ROWS[i]["question_id"]]
                       for i, r in zip((0, 2), ok))
        assert rows["1"]["error"] and "400" in rows["1"]["error"]
        logged = run["samples"]["videomme_local"]
        assert [d["filtered_resps"] for d in logged][1] in (NO_ANSWER, [NO_ANSWER])

    # a missing video: lmms-eval's videomme task sys.exit()s inside doc_to_visual
    gone = t["hf"] / "videomme" / "data" / (VMME_ROWS[0]["videoID"] + ".mp4")
    held = gone.with_suffix(".held")
    gone.rename(held)
    try:
        with ScriptedServer(answers) as server:
            run = run_lmms_eval(t["tmp"], "missing", "videomme_local", f"model={server.url},frames=4", t["include"],
                                t["hf"], "--limit", "1")
    finally:
        held.rename(gone)
    missing = (run["out"] / "paravt_traces" / "videomme_local" / "missing_videos.jsonl").read_text()
    assert "doc_to_visual failed" in missing
    assert run["samples"]["videomme_local"][0]["videomme_perception_score"]["score"] == 0


def test_traces_open_in_paravt_eval_report(bench_tasks, tmp_path):
    t = bench_tasks
    with ScriptedServer(scripted_answers(t["charades_docs"])) as server:
        run = run_lmms_eval(t["tmp"], "report", "charades_local", f"model={server.url},frames=4", t["include"], t["hf"],
                            "--limit", "2")
    html = tmp_path / "report.html"
    traces = run["out"] / "paravt_traces" / "charades_local"
    r = subprocess.run([sys.executable, "-m", "paravt", "eval", "report", str(traces), "--html", str(html), "--thumbs",
                        "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert html.is_file() and "charades_local" in html.read_text()


# ---- (d) LongVT's own loop: lmms-eval's async_openai + paravt mcp + paravt serve -----------------------


def test_longvts_loop_runs_on_paravt_serve_and_paravt_mcp(tmp_path):
    """scripts/longvt_loop.py on two SynthVT-mini questions of one video: lmms-eval's async_openai
    declares paravt mcp's tools to paravt serve (the shipped paradox-base), the call paravt serve reads
    from the model's reply reaches crop_video, its frames go back as images of a tool message, the
    model answers, and lmms-eval scores the answer as paravt scores it."""
    out = tmp_path / "loop"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "longvt_loop.py"), "--out", str(out), "--n", "2"],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    rows = {row["id"]: row for row in summary["rows"]}
    assert len(rows) == 2
    colour = rows["test_00000-q0"]  # the event question: the model crops (the background control it answers)
    assert [c["name"] for c in colour["calls"]] == ["crop_video"] and colour["calls"][0]["frames"] >= 1
    assert colour["calls"][0]["result"].startswith("Frames of ")
    truth = {s.id: s for s in load_benchmark("synthvt", out / "split").samples}
    for sid, row in rows.items():  # (the whole final turn is logged: the answers are short)
        s = truth[sid]
        assert row["score"] == score_prediction(P.extract_answer(row["final"]), s.answer, s.question_type)
    assert summary["score"] == pytest.approx(colour["lmms_eval_mean"])
    print(f"\nLongVT's loop on paravt serve (paradox-base) + paravt mcp: {summary['calls']} call(s), "
          f"{summary['frames_back']} frames back, score {summary['score']:.2f}, {summary['seconds']:.0f} s")
