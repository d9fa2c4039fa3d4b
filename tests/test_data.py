import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from paravt.data import DataError, load_rl_rows


def _row(**over):
    row = {"prompt": [{"role": "user", "content": "<video>\nWhat colour?\nA. red\nB. blue"}],
           "videos": [{"video": "videos/a.mp4"}],
           "extra_info": json.dumps({"answer": "A", "question_type": "mcq", "id": "q1"})}
    row.update(over)
    return row


def _write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_reads_rows_relative_to_the_root(tmp_path):
    p = _write(tmp_path / "rl.parquet", [_row()])
    [s] = load_rl_rows(p)
    assert s.id == "q1" and s.answer == "A" and s.question_type == "mcq"
    assert s.question == "What colour?\nA. red\nB. blue" and "<video>" not in s.question
    assert s.video == str(tmp_path / "videos" / "a.mp4")
    [s] = load_rl_rows(p, "/data/root")
    assert s.video == "/data/root/videos/a.mp4"


def test_extra_info_as_dict_prompt_as_json_and_parts(tmp_path):
    rows = [_row(extra_info={"answer": "[1, 2]", "question_type": "tvg", "id": "x"}),
            _row(prompt=json.dumps([{"role": "system", "content": "s"},
                                    {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "Q?"}]}]),
                 videos=["/abs/v.mp4"])]
    a = load_rl_rows(_write(tmp_path / "rl.parquet", rows[:1]))[0]
    assert a.question_type == "tvg" and a.answer == "[1, 2]"
    pq.write_table(pa.Table.from_pylist(rows[1:]), tmp_path / "b.parquet")
    b = load_rl_rows(tmp_path / "b.parquet")[0]
    assert b.question == "Q?" and b.video == "/abs/v.mp4" and b.id == "q1"
    assert a.system is None and b.system == "s"  # a row's own system prompt is kept


def test_a_rows_system_prompt_reaches_the_episode(tmp_path):
    """ParaVT-Parquet rows carry their own system prompt: the rollout's main agent sees it (with the
    tool declared after it), not the profile's default instructions."""
    import asyncio

    from paravt import protocol as P
    from paravt.agent import EpisodeConfig
    from paravt.backends.scripted import ScriptedBackend
    from paravt.train.grpo import Job, run_rollouts
    from tests.videotools import make_test_video

    (tmp_path / "videos").mkdir()
    make_test_video(tmp_path / "videos" / "a.mp4", seconds=4, fps=5)
    rows = [_row(prompt=[{"role": "system", "content": "You are the row's agent."},
                         {"role": "user", "content": "<video>\nWhat colour?"}])]
    [s] = load_rl_rows(_write(tmp_path / "rl.parquet", rows))
    b = ScriptedBackend(["ok</think><answer>A</answer>"])
    [ep] = asyncio.run(run_rollouts(b, [Job(0, 0, s, 4, 0, 1)], EpisodeConfig(frames=4), 0.7))
    system = b.requests[0].messages[0].text()
    assert system.startswith("You are the row's agent.\n\n# Tools") and P.system_prompt("parallel") not in system


@pytest.mark.parametrize("bad, match", [
    ({"extra_info": "{}"}, "no 'answer'"),
    ({"extra_info": "{not json"}, "not valid JSON"),
    ({"extra_info": json.dumps({"answer": "A", "question_type": "yesno"})}, "question_type"),
    ({"videos": []}, "non-empty list"),
    ({"prompt": [{"role": "assistant", "content": "x"}]}, "no user message"),
])
def test_bad_rows_name_the_row(tmp_path, bad, match):
    p = _write(tmp_path / "bad.parquet", [_row(), _row(**bad)])
    with pytest.raises(DataError, match=f"row 1.*{match}"):
        load_rl_rows(p)


def test_missing_column_and_missing_or_non_parquet_file(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"prompt": [{"role": "user", "content": "x"}]}]), tmp_path / "c.parquet")
    with pytest.raises(DataError, match="missing column 'videos'"):
        load_rl_rows(tmp_path / "c.parquet")
    with pytest.raises(DataError, match="no such file"):
        load_rl_rows(tmp_path / "none.parquet")
    (tmp_path / "t.parquet").write_text("hello")
    with pytest.raises(DataError, match="not a readable parquet"):
        load_rl_rows(tmp_path / "t.parquet")
