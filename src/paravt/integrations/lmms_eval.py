"""paravt as an lmms-eval model: `python -m lmms_eval --model paravt --model_args ... --tasks ...`.

lmms-eval hands the model one request per document: the task's prompt (its `doc_to_text`), the
document's visuals (`doc_to_visual`) and generation settings. Here each request runs paravt's own
episode, the one `paravt eval` runs (the eval runner over `paravt.agent.run_episode`: K overview
frames, crop_video calls dispatched to sub-agents, any dispatch mode), and the episode's answer goes
back in the form the task's `process_results` reads. lmms-eval then scores it with the task's own code.

From request to episode:
- question: the task's prompt as lmms-eval renders it, unchanged: its options, its answer instruction
  and any subtitles it carries stay in it (paravt's prompt profile wraps it like any question). The
  options are parsed from its "A. ..." / "(A) ..." / "A: ..." options, on lines or inline
  (`protocol.options`, the grammar the mcq scorer reads).
- question type: `tvg` for temporal-grounding tasks (a task name with "grounding" or "charades"),
  `mcq` when the prompt lists options, else `oe`; `question_type=` forces one.
- video: the first path (or URL) `doc_to_visual` gives; a document without one is reported as missing
  (paravt's missing_videos.jsonl) and answered NO_ANSWER.
- the task's generation_kwargs are not used: the episode has its own budgets (2048 new tokens a turn, a
  forced final answer; see `eval_config`) and the sampling settings of the model args.

What goes back (`answer=letter`, the default): for mcq the option letter paravt reads from the answer
(`rewards.mcq_letter`), for tvg the span as "start - end" seconds, for oe the answer text.
`answer=raw`: the answer as the model wrote it (the <answer> body), for the task's own extraction to
read. An episode without an answer, or one that failed, gives NO_ANSWER, which no task reads as an
answer (an empty string would: MMVU's open-ended rule counts `prediction in reference` as correct).

Traces: each task's episodes are a `paravt eval` run directory (results.jsonl with every episode,
manifest.json, summary.json/md, missing_videos.jsonl), `traces=DIR/<task>`, by default
`<--output_path>/paravt_traces/<task>`: `paravt eval report DIR/<task> --html report.html` shows them.
Like `paravt eval` it resumes: a rerun with the same directory and settings reuses the finished
episodes. Its summary scores with paravt's metrics against the truth read from the document (the
"answer" / "correct_choice" / "timestamp" fields); lmms-eval's own score is in its results.json. A
failed episode is an error row there and NO_ANSWER here; the run goes on. A server that does not
answer before the run, or the model failing on `max_consecutive_errors` samples in a row, stops it
(rerun to resume).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Callable

try:
    from lmms_eval.api.model import lmms
    from loguru import logger as eval_logger
except ImportError as e:  # imported by hand where lmms-eval is not: say the command that installs it
    from paravt.extras import missing_extra

    raise ImportError(missing_extra("paravt's lmms-eval model", "lmms-eval", e)) from None

from paravt.eval.benchmarks import LETTERS, MissingVideo, Sample
from paravt.eval.runner import (RESULTS, ManifestMismatch, eval_config, latest_rows, read_results, run_eval_async,
                                write_text)
from paravt.protocol import QUESTION_TYPES, options_from_question
from paravt.rewards import parse_span

# What a request without an answer gets back: no task's extraction reads a letter, a time or a
# reference text in it (see the module docstring).
NO_ANSWER = "∅"
ANSWER_MODES = ("letter", "raw")
GROUNDING_TASK_WORDS = ("grounding", "charades")
TRACES_DIR = "paravt_traces"
ENDPOINT_SEPARATORS = "|; "  # lmms-eval splits --model_args on commas


@dataclass
class Settings:
    """The model args (`--model_args key=value,...`), the same as `paravt eval`'s options."""

    model: str | None = None  # checkpoint directory, hub id in the local cache, or a server URL
    endpoints: str | None = None  # several server URLs used at once, separated by | or ;
    frames: int = 64
    mode: str = "parallel"
    max_turns: int = 3
    max_parallel: int = 5
    max_new_tokens: int = 2048
    prompts: str = "paravt"
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    timeout: float = 600.0  # seconds per model call, retries included
    sample_timeout: float = 1800.0  # seconds per episode before it is an error row
    concurrency: int = 4  # episodes in flight
    final_turn_think: bool = True
    api_key: str | None = None
    served_model: str | None = None
    image_format: str = "png"
    question_type: str = "auto"
    answer: str = "letter"
    traces: str | None = None
    max_consecutive_errors: int = 20
    device: str | None = None  # in-process model only

    def __post_init__(self) -> None:
        if self.question_type not in ("auto", *QUESTION_TYPES):
            raise ValueError(f"question_type must be auto or one of {', '.join(QUESTION_TYPES)}, got "
                             f"{self.question_type!r}")
        if self.answer not in ANSWER_MODES:
            raise ValueError(f"answer must be one of {', '.join(ANSWER_MODES)}, got {self.answer!r}")
        if self.concurrency < 1 or self.max_consecutive_errors < 1:
            raise ValueError("concurrency and max_consecutive_errors must be >= 1")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")

    @classmethod
    def from_model_args(cls, args: dict[str, Any]) -> "Settings":
        """Settings from lmms-eval's parsed model args; an unknown key is an error naming the known ones.
        lmms-eval turns "64" into 64; for an optional arg "none" or "" means unset (mode=none is a mode)."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise ValueError(f"paravt: unknown model arg(s) {', '.join(unknown)}; known: {', '.join(known)}")
        kw: dict[str, Any] = {}
        for k, v in args.items():
            optional = "None" in str(known[k].type)
            if optional and isinstance(v, str) and v.strip().lower() in ("", "none", "null"):
                v = None
            if v is not None:
                kw[k] = _typed(k, v, known[k].type)
        return cls(**kw)

    def endpoint_list(self) -> str | None:
        """The endpoints as `paravt eval --endpoints` takes them (comma-separated)."""
        if not self.endpoints:
            return None
        text = str(self.endpoints)
        for sep in ENDPOINT_SEPARATORS:
            text = text.replace(sep, ",")
        return ",".join(u for u in text.split(",") if u)

    def model_id(self) -> str:
        return self.model or self.endpoint_list() or "default"


def _typed(name: str, value: Any, annotation: str) -> Any:
    """A model arg converted to its field's type, or a ValueError naming the arg."""
    kind = annotation.split("|")[0].strip()
    try:
        if kind == "int":
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if kind == "float":
            return float(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            raise ValueError
        return str(value)
    except (TypeError, ValueError):
        raise ValueError(f"paravt: model arg {name}={value!r} is not a {kind}") from None


# ----------------------------------------------------------------------------------------------
# one request -> one Sample


def question_type_of(task: str, prompt: str, forced: str = "auto") -> str:
    """The episode's question type: forced, else grounding by task name, else mcq when the prompt
    lists options, else open-ended."""
    if forced != "auto":
        return forced
    if any(w in task.lower() for w in GROUNDING_TASK_WORDS):
        return "tvg"
    return "mcq" if options_from_question(prompt) else "oe"


def video_of(visuals: Any) -> str | None:
    """The first video path or URL among what doc_to_visual gave (a list, or one item)."""
    items = visuals if isinstance(visuals, (list, tuple)) else [visuals]
    for v in items:
        if isinstance(v, (str, os.PathLike)) and str(v).strip():
            return str(v)
    return None


def truth_of(doc: dict, question_type: str, options: list[str]) -> str:
    """The document's answer as paravt scores it (for the traces' own summary; lmms-eval scores with
    the task's code): an option letter, "[s, e]", or the reference text; "" when the document has
    none of the usual fields ("answer", "correct_choice", "timestamp")."""
    if question_type == "tvg":
        span = parse_span(doc.get("timestamp", doc.get("answer")))
        return f"[{span[0]:g}, {span[1]:g}]" if span else ""
    answer = doc.get("answer")
    if question_type == "mcq":
        letters = LETTERS[: len(options)]
        choice = doc.get("correct_choice")
        if isinstance(choice, int) and 0 <= choice < len(letters):
            return letters[choice]
        a = str(answer or "").strip().strip("()").strip().upper()
        return a if len(a) == 1 and a in letters else ""
    return "" if answer is None else str(answer)


@dataclass
class Request:
    """One lmms-eval request, read: its sample, or why it has none."""

    index: int  # place in the list lmms-eval handed over
    task: str
    doc_id: str
    sample: Sample | None
    missing: str | None = None  # why no video: a MissingVideo's looked_for


def read_request(index: int, args: tuple, task_docs: dict, settings: Settings) -> Request:
    """A request's arguments (context, gen_kwargs, doc_to_visual, doc_id, task, split) as a Sample."""
    context, _gen_kwargs, doc_to_visual, doc_id, task, split = args
    sid = str(doc_id)
    try:
        doc = task_docs[task][split][doc_id]
    except (KeyError, IndexError, TypeError) as e:
        return Request(index, task, sid, None, f"no document {task}/{split}/{doc_id} ({type(e).__name__})")
    try:
        video = video_of(doc_to_visual(doc))
    except (Exception, SystemExit) as e:  # noqa: BLE001 - several tasks sys.exit() on a missing video
        return Request(index, task, sid, None, f"doc_to_visual failed: {type(e).__name__}: {e}")
    if video is None:
        return Request(index, task, sid, None, "doc_to_visual gave no video path (paravt runs on videos)")
    if not video.startswith(("http://", "https://")) and not Path(video).is_file():
        return Request(index, task, sid, None, video)
    qtype = question_type_of(task, context, settings.question_type)
    options = options_from_question(context) if qtype == "mcq" else None
    opts = [f"{LETTERS[i]}. {o}" for i, o in enumerate(options or [])]
    truth = truth_of(doc, qtype, opts)
    sample = Sample(id=sid, bench=task, video_path=video, question=context, answer=truth, question_type=qtype,
                    options=opts, extras={"task": task, "split": split, "truth_known": bool(truth)})
    return Request(index, task, sid, sample)


def _num(x: float) -> str:
    return f"{x:.6f}".rstrip("0").rstrip(".")


def response_of(row: dict | None, question_type: str, answer_mode: str = "letter") -> str:
    """What lmms-eval gets for one episode's results.jsonl row (see the module docstring)."""
    if row is None or row.get("error") or row.get("prediction") is None:
        return NO_ANSWER
    if answer_mode == "raw" or question_type == "oe":
        return str(row["prediction"]).strip() or NO_ANSWER
    parsed = row.get("parsed")
    if question_type == "mcq":
        return parsed if isinstance(parsed, str) and parsed else NO_ANSWER
    if isinstance(parsed, (list, tuple)) and len(parsed) == 2:
        return f"{_num(float(parsed[0]))} - {_num(float(parsed[1]))}"
    return NO_ANSWER


# ----------------------------------------------------------------------------------------------
# where the traces go


def output_path_from_argv(argv: list[str]) -> str | None:
    """lmms-eval's --output_path, read from its command line (the harness does not pass it to models)."""
    for i, a in enumerate(argv):
        if a == "--output_path" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--output_path="):
            return a.split("=", 1)[1]
    return None


def traces_root(settings: Settings, argv: list[str] | None = None) -> tuple[Path, bool]:
    """(directory holding a run directory per task, kept?): traces=DIR, else <--output_path>/paravt_traces,
    else a temporary directory removed at exit."""
    if settings.traces:
        return Path(settings.traces).expanduser(), True
    out = output_path_from_argv(sys.argv if argv is None else argv)
    if out:
        return Path(out).expanduser() / TRACES_DIR, True
    tmp = Path(tempfile.mkdtemp(prefix="paravt_traces_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    return tmp, False


# ----------------------------------------------------------------------------------------------
# the model


class ParaVT(lmms):
    """paravt's parallel agent as an lmms-eval model (`--model paravt`); model args: `Settings`."""

    is_simple = True  # lmms-eval gives simple models the task's prompt text (doc_to_text)

    def __init__(self, batch_size: Any = None, max_batch_size: Any = None, **model_args: Any) -> None:
        super().__init__()
        # batch_size is lmms-eval's; paravt's own batching knob is concurrency (episodes in flight)
        self.settings = Settings.from_model_args(model_args)
        s = self.settings
        self.config = eval_config(mode=s.mode, frames=s.frames, max_turns=s.max_turns, max_parallel=s.max_parallel,
                                  max_new_tokens=s.max_new_tokens, prompts=s.prompts, model_timeout_s=s.timeout,
                                  final_turn_think=s.final_turn_think, temperature=s.temperature, top_p=s.top_p,
                                  seed=s.seed)
        self._backends = self._backend_factory()
        self.traces, self._keep_traces = traces_root(s)

    def _backend_factory(self) -> Callable[[], Any]:
        """Builds the backend inside each run's event loop. An in-process model is loaded once, here,
        so that a bad path fails before any task is read."""
        s = self.settings
        endpoints = s.endpoint_list()
        if endpoints or (s.model and s.model.startswith(("http://", "https://"))):
            from paravt.eval.commands import make_backends

            asyncio.run(make_backends(s.model, endpoints, s.api_key, s.served_model, s.image_format,
                                      timeout_s=s.timeout).aclose())  # a bad URL fails here, before any task
            return lambda: make_backends(s.model, endpoints, s.api_key, s.served_model, s.image_format,
                                         timeout_s=s.timeout)
        from paravt.ask import default_model
        from paravt.backends.hf import HFBackend
        from paravt.models import load_model

        name = s.model or default_model()
        if name is None:
            raise ValueError("paravt: no model= given and no default model (set model=PATH_OR_URL)")
        model, processor = load_model(str(name), device=s.device)
        return lambda: HFBackend(model, processor)

    def generate_until(self, requests) -> list[str]:
        """One episode per request, the tasks one after another, each task's episodes concurrently."""
        reqs = [read_request(i, r.args, self.task_dict, self.settings) for i, r in enumerate(requests)]
        out = [NO_ANSWER] * len(reqs)
        for task in dict.fromkeys(r.task for r in reqs):
            for i, text in self._run_task(task, [r for r in reqs if r.task == task]).items():
                out[i] = text
        for r, text in zip(requests, out):
            self.cache_hook.add_partial("generate_until", (r.args[0], r.args[1]), text)
        if not self._keep_traces:
            eval_logger.warning(f"paravt: no --output_path or traces=DIR: the episode traces in {self.traces} "
                                "are not kept")
        return out

    def _run_task(self, task: str, reqs: list[Request]) -> dict[int, str]:
        """Run one task's samples through the eval runner; {request index: response}."""
        ids = _unique_ids(reqs)
        samples, missing = [], []
        for r, sid in zip(reqs, ids):
            if r.sample is None:
                missing.append(MissingVideo(sid, r.missing or "?"))
                eval_logger.warning(f"paravt: {task} document {sid}: no video ({r.missing}); answered {NO_ANSWER}")
                continue
            r.sample.id = sid
            samples.append(r.sample)
        out_dir = self.traces / _safe_name(task)
        if not samples:  # nothing to run: still say which documents had no video
            out_dir.mkdir(parents=True, exist_ok=True)
            write_text(out_dir / "missing_videos.jsonl", "".join(json.dumps(asdict(m)) + "\n" for m in missing))
            return {r.index: NO_ANSWER for r in reqs}
        s = self.settings
        manifest = {"lmms_eval_task": task, "answer": s.answer, "question_type": s.question_type,
                    "info": {"endpoints": s.endpoint_list(), "harness": "lmms-eval"}}
        try:
            summary = asyncio.run(run_eval_async(
                samples, self._backends, self.config, out_dir, concurrency=s.concurrency, progress=True,
                model=s.model_id(), manifest=manifest, missing=missing, sample_timeout_s=s.sample_timeout or None,
                max_consecutive_backend_errors=s.max_consecutive_errors))
        except ManifestMismatch as e:
            raise ManifestMismatch(f"paravt: {e}. Here: give traces=DIR or another --output_path") from None
        if summary.get("errors"):
            eval_logger.warning(f"paravt: {task}: {summary['errors']} of {summary['n']} episodes failed, answered "
                                f"{NO_ANSWER}; causes: {summary.get('error_causes')}; rows in {out_dir / RESULTS}")
        rows = latest_rows(read_results(out_dir / RESULTS, repair=False))
        return {r.index: (response_of(rows.get(sid), r.sample.question_type, s.answer) if r.sample else NO_ANSWER)
                for r, sid in zip(reqs, ids)}

    def loglikelihood(self, requests) -> list[tuple[float, bool]]:
        raise NotImplementedError("paravt is an agent that generates answers: loglikelihood tasks are not supported")

    def generate_until_multi_round(self, requests) -> list[str]:
        raise NotImplementedError("paravt answers in one episode per question: multi-round tasks are not supported")


def _unique_ids(reqs: list[Request]) -> list[str]:
    """Each request's row id: its doc id, with '#k' for the k-th repeat of the same document."""
    seen: dict[str, int] = {}
    ids = []
    for r in reqs:
        base = r.doc_id
        k = seen.get(base, 0)
        seen[base] = k + 1
        ids.append(base if k == 0 else f"{base}#{k}")
    return ids


def _safe_name(task: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in task) or "task"
