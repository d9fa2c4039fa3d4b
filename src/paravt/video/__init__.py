"""Video frames for the episode: `VideoReader` (overview(K), crop(start, end), frames_at(times)),
resized to a pixel budget.

    sources.py   files and http(s) URLs (range reads, deadlines, network errors)
    media.py     the media root (resolve_media; a file checked as opened) and the single-file rule
    net.py       what a URL's server must do (ranges, a length); each read's budget of bytes and time
    streams.py   which of a file's video streams is the video
    index.py     the probe: packets demuxed, nothing decoded; seeking; timestamps that jump
    passes.py    one forward read of clean frames past damaged data
    decode.py    the frames nearest requested times: seek policy, landing check, pick
    sampling.py  which times for K or a window, and the frame size for a pixel budget
    reader.py    VideoReader, which ties them together, and its async decode pool
    frames.py, errors.py   what a reader returns and raises

Import from here: `from paravt.video import VideoReader, VideoError, Frame, sample_times`; a
server holding files to a folder: `resolve_media(root, name)`, then `VideoReader(path, media_root=root)`.
"""

from paravt.video.errors import VideoError
from paravt.video.frames import Frame, VideoInfo
from paravt.video.media import MediaRootError, resolve_media
from paravt.video.reader import VideoReader
from paravt.video.sampling import (FACTOR, MAX_FRAMES, MAX_PIXELS, MIN_PIXELS, overview_times, resize_to_budget,
                                   sample_times)
from paravt.video.sources import MAX_VIDEO_PIXELS, NET_TIMEOUT_S, URL_SCHEMES, is_url

__all__ = ["FACTOR", "MAX_FRAMES", "MAX_PIXELS", "MAX_VIDEO_PIXELS", "MIN_PIXELS", "NET_TIMEOUT_S", "URL_SCHEMES",
           "Frame", "MediaRootError", "VideoError", "VideoInfo", "VideoReader", "is_url", "overview_times",
           "resize_to_budget", "resolve_media", "sample_times"]
