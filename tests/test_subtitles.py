"""Subtitle cues and the two protocols that place them (lmms-eval's Video-MME, LongVideoBench's own)."""

import json
from dataclasses import asdict

import pytest

from paravt.subtitles import Cue, Subtitles, for_frames, load_lvb_subtitles, parse_lvb_subtitles, parse_srt


def test_parse_srt_bom_crlf_markup_and_missing_numbers():
    text = ("\ufeff1\r\n00:00:00,000 --> 00:00:01,000\r\n<b>Hi</b> there\r\nsecond line\r\n\r\n"
            "00:00:01,000 --> 00:00:02,500 X1:10\r\n{\\an8}no number\r\n\r\n"
            "3\r\n00:01:02,250 --> 01:00:00,000\r\n\r\n")  # an empty cue is dropped
    assert parse_srt(text) == [Cue(0.0, 1.0, "Hi there second line"), Cue(1.0, 2.5, "no number")]


def test_parse_srt_reads_videomme_font_cues_as_lmms_eval():
    """Each cue's lines joined by a space, then the first <font> element's text; cues sharing
    (start, end) are one, the last text at the first place (lmms-eval keys a dict by them)."""
    text = ('1\n00:00:01,000 --> 00:00:02,000\n<font color="white" size=".72c">one</font>\n'
            '<font color="white" size=".72c">not read</font>\n\n'
            '2\n00:00:02,000 --> 00:00:03,000\n<font color="white" size=".72c">two</font>\n\n'
            '3\n00:00:01,000 --> 00:00:02,000\n<font color="white" size=".72c">one again</font>\n')
    assert parse_srt(text) == [Cue(1.0, 2.0, "one again"), Cue(2.0, 3.0, "two")]


def test_at_frames_keeps_cues_shown_at_a_frame_start_inclusive_end_exclusive():
    subs = Subtitles([Cue(0, 2, "a"), Cue(2, 4, "b"), Cue(3, 10, "c"), Cue(20, 21, "d")], "at_frames")
    assert for_frames(subs, [2.0, 3.5]) == (["", ""], "b\nc")
    assert for_frames(subs, [4.0]) == ([""], "c")
    assert for_frames(subs, [15.0]) == ([""], "")
    assert for_frames(subs, []) == ([], "")


def test_interleaved_places_each_cue_after_the_last_frame_before_its_midpoint():
    subs = Subtitles([Cue(0.5, 1.5, "one"), Cue(0.8, 3.2, "two"), Cue(4.1, 4.4, "short"), Cue(5.5, 5.8, "lost"),
                      Cue(20.0, 30.0, "beyond")], "interleaved")
    per_frame, block = for_frames(subs, [0, 1, 4, 7])
    # "one": midpoint 1.0 -> after the frame at 1 s; "two" likewise (midpoint 2.0), joined by a newline;
    # "short" (0.3 s, midpoint 4.25) widened to 3.75..4.75 covers the frame at 4 s; "lost", widened
    # to 5.15..6.15, covers no frame; "beyond" covers none either.
    assert per_frame == ["", "one\ntwo", "short", ""] and block == ""


def test_interleaved_text_before_the_first_frame_goes_after_it():
    subs = Subtitles([Cue(-3.0, 2.0, "across the start")], "interleaved")  # midpoint -0.5, covers 0 and 1
    assert for_frames(subs, [0.0, 1.0]) == (["across the start", ""], "")
    assert for_frames(subs, []) == ([], "")


def test_lvb_entries_both_shapes_offset_and_null_end():
    entries = [{"start": "00:03:10.000", "end": "00:03:12.500", "line": "youtube shape\n "},
               {"timestamp": [188.0, 189.5], "text": " whisper shape"},
               {"timestamp": [190.0, None], "text": " The"}]
    assert parse_lvb_subtitles(entries, offset=186, duration=13.97) == [
        Cue(4.0, 6.5, "youtube shape"), Cue(2.0, 3.5, "whisper shape"), Cue(4.0, 13.97, "The")]
    with pytest.raises(ValueError, match="entry 0 is neither"):
        parse_lvb_subtitles([{"begin": 1}], 0, 10)


def test_load_lvb_subtitles(tmp_path):
    p = tmp_path / "x_en.json"
    assert load_lvb_subtitles(p, 0, 10) is None
    p.write_text(json.dumps([{"start": "00:00:01.000", "end": "00:00:02.000", "line": "hi"}]))
    assert load_lvb_subtitles(p, 0, 10) == Subtitles([Cue(1.0, 2.0, "hi")], "interleaved")
    p.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(ValueError, match="x_en.json"):
        load_lvb_subtitles(p, 0, 10)


def test_subtitles_round_trip_through_json_and_check_the_protocol():
    subs = Subtitles([Cue(0.0, 1.5, "a")], "at_frames")
    assert Subtitles.from_dict(json.loads(json.dumps(asdict(subs)))) == subs
    with pytest.raises(ValueError, match="unknown subtitle protocol"):
        Subtitles([], "whole_file")
