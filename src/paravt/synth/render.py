"""SynthVT videos: scenes of flat background colour, and sparse short events (a coloured shape
at a place for a few seconds), rendered with numpy and encoded as real H.264 MP4 (PyAV).
Everything is a deterministic function of the seed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

COLOURS = {  # bright event colours, far from every background
    "red": (230, 30, 30), "green": (30, 200, 40), "blue": (40, 80, 245), "yellow": (245, 225, 30),
    "white": (250, 250, 250), "magenta": (230, 40, 220), "cyan": (30, 225, 230), "orange": (250, 140, 20),
}
BACKGROUNDS = {  # dark, low-saturation scene colours
    "dark grey": (45, 45, 45), "navy": (20, 24, 70), "dark green": (18, 60, 28), "brown": (70, 45, 25),
    "black": (6, 6, 6), "purple": (55, 20, 65),
}
SHAPES = ("circle", "square", "triangle", "cross", "star", "diamond")
POSITIONS = {"upper left": (0.3, 0.3), "upper right": (0.3, 0.7), "lower left": (0.7, 0.3),
             "lower right": (0.7, 0.7), "centre": (0.5, 0.5)}


@dataclass
class Event:
    shape: str
    colour: str
    position: str
    start: float
    end: float

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclass
class Scene:
    colour: str
    start: float
    end: float


@dataclass
class VideoSpec:
    seed: int
    duration: float
    fps: int
    size: int
    scenes: list[Scene] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "VideoSpec":
        d = dict(d)
        d["scenes"] = [Scene(**s) for s in d["scenes"]]
        d["events"] = [Event(**e) for e in d["events"]]
        return cls(**d)

    def scene_at(self, t: float) -> Scene:
        for s in self.scenes:
            if s.start <= t < s.end:
                return s
        return self.scenes[-1]

    def events_at(self, t: float) -> list[Event]:
        return [e for e in self.events if e.start <= t < e.end]


def make_spec(seed: int, *, min_len: float = 60, max_len: float = 600, fps: int = 2, size: int = 64,
              n_events: tuple[int, int] = (2, 5), event_len: tuple[float, float] = (1.0, 8.0),
              scene_len: tuple[float, float] = (20.0, 60.0)) -> VideoSpec:
    """Sample a video: length, scenes, and non-overlapping events with distinct (colour, shape)."""
    rng = np.random.default_rng(seed)
    duration = float(round(rng.uniform(min_len, max_len)))
    scenes, t = [], 0.0
    bg_names = list(BACKGROUNDS)
    prev = None
    while t < duration:
        length = float(round(rng.uniform(*scene_len)))
        colour = str(rng.choice([b for b in bg_names if b != prev]))
        scenes.append(Scene(colour, t, min(duration, t + length)))
        prev, t = colour, t + length
    events: list[Event] = []
    used: set[tuple[str, str]] = set()
    n = int(rng.integers(n_events[0], n_events[1] + 1))
    for _ in range(n * 20):
        if len(events) == n:
            break
        d = float(round(rng.uniform(*event_len) * 2) / 2)
        start = float(round(rng.uniform(1.0, duration - d - 1.0) * 2) / 2)
        if any(start < e.end + 2 and e.start < start + d + 2 for e in events):
            continue  # keep events apart so each window shows one thing
        colour, shape = str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES))
        if (colour, shape) in used:
            continue
        used.add((colour, shape))
        events.append(Event(shape, colour, str(rng.choice(list(POSITIONS))), start, start + d))
    events.sort(key=lambda e: e.start)
    return VideoSpec(seed=seed, duration=duration, fps=fps, size=size, scenes=scenes, events=events)


def _mask(shape: str, size: int, cy: float, cx: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    dy, dx = (yy - cy) / r, (xx - cx) / r
    if shape == "circle":
        return dy**2 + dx**2 <= 1
    if shape == "square":
        return (np.abs(dy) <= 0.85) & (np.abs(dx) <= 0.85)
    if shape == "diamond":
        return np.abs(dy) + np.abs(dx) <= 1
    if shape == "triangle":
        return (dy <= 0.8) & (dy >= -1) & (np.abs(dx) <= (dy + 1) / 1.8 * 0.95)
    if shape == "cross":
        return ((np.abs(dy) <= 0.3) & (np.abs(dx) <= 1)) | ((np.abs(dx) <= 0.3) & (np.abs(dy) <= 1))
    if shape == "star":
        ang = np.arctan2(dy, dx)
        rad = np.sqrt(dy**2 + dx**2)
        return rad <= 0.5 + 0.5 * (np.cos(5 * ang) > 0.3)
    raise ValueError(f"unknown shape {shape!r}")


def event_mask(e: Event, size: int) -> np.ndarray:
    py, px = POSITIONS[e.position]
    return _mask(e.shape, size, py * size, px * size, size * 0.2)


def render_frame(spec: VideoSpec, t: float) -> np.ndarray:
    img = np.empty((spec.size, spec.size, 3), np.uint8)
    img[:] = BACKGROUNDS[spec.scene_at(t).colour]
    for e in spec.events_at(t):
        img[event_mask(e, spec.size)] = COLOURS[e.colour]
    return img


def write_video(spec: VideoSpec, path: str | Path, gop_s: float = 10.0) -> Path:
    """Encode the spec as H.264 MP4 (yuv420p, long GOP). Frames repeat between changes, so
    the cost is mostly the encoder's; a 600 s video at 2 fps takes well under a second."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part.mp4")
    n = int(round(spec.duration * spec.fps))
    with av.open(str(tmp), mode="w") as out:
        stream = out.add_stream("libx264", rate=Fraction(spec.fps, 1))
        stream.width = stream.height = spec.size
        stream.pix_fmt = "yuv420p"
        g = max(1, int(gop_s * spec.fps))
        stream.options = {"g": str(g), "keyint_min": str(g), "sc_threshold": "0", "preset": "veryfast", "crf": "20",
                          "threads": "1"}
        last_key, last_frame = None, None
        for i in range(n):
            t = i / spec.fps  # the frame at pts t shows the state at t
            key = (spec.scene_at(t).colour, tuple(e.name for e in spec.events_at(t)))
            if key != last_key:
                last_frame = av.VideoFrame.from_ndarray(render_frame(spec, t), format="rgb24")
                last_key = key
            last_frame.pts = None
            for packet in stream.encode(last_frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    tmp.replace(path)  # a video on disk is always complete
    return path
