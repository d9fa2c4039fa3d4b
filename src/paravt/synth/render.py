"""SynthVT videos: scenes of dark, lightly textured background, and sparse short events (a
bright shape at a place for a few seconds), rendered with numpy and encoded as real H.264
MP4 through PyAV. Everything is a deterministic function of the seed.

Why hand-written: no library renders this kind of controllable test pattern; the shapes are
vectorised masks over a pixel grid, built once per event (not per frame).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

COLOURS = {  # bright, saturated event colours, far from every background
    "red": (230, 30, 30), "green": (30, 200, 40), "blue": (40, 80, 245), "yellow": (245, 225, 30),
    "white": (250, 250, 250), "magenta": (230, 40, 220), "cyan": (30, 225, 230), "orange": (250, 140, 20),
}
BACKGROUNDS = {  # dark, low-saturation scene colours
    "dark grey": (45, 45, 45), "navy": (20, 24, 70), "dark green": (18, 60, 28), "brown": (70, 45, 25),
    "black": (6, 6, 6), "purple": (55, 20, 65),
}
TEXTURES = ("plain", "stripes", "checks")  # low-contrast (±10 levels): the colour stays nameable
SHAPES = ("circle", "square", "triangle", "cross", "star", "diamond")
POSITIONS = {"upper left": (0.3, 0.3), "upper right": (0.3, 0.7), "lower left": (0.7, 0.3),
             "lower right": (0.7, 0.7), "centre": (0.5, 0.5)}
SHAPE_RADIUS = 0.2  # of the frame side: a 26-pixel shape at 64x64 survives H.264 and a tiny ViT
CONTROL_MIN_K = 4  # the first scene is long enough to be in the first overview frame for every K >= this


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

    def visible_at(self, t: float) -> bool:
        """The frame with timestamp t shows the event (frames show the state at their own time)."""
        return self.start <= t < self.end


@dataclass
class Scene:
    colour: str
    start: float
    end: float
    texture: str = "plain"


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
        d = {k: d[k] for k in ("seed", "duration", "fps", "size", "scenes", "events")}
        d["scenes"] = [Scene(**s) for s in d["scenes"]]
        d["events"] = [Event(**e) for e in d["events"]]
        return cls(**d)

    def scene_at(self, t: float) -> Scene:
        for s in self.scenes:
            if s.start <= t < s.end:
                return s
        return self.scenes[-1]

    def events_at(self, t: float) -> list[Event]:
        return [e for e in self.events if e.visible_at(t)]


def check_frame(size: int, fps: int) -> None:
    """The frame size and rate a video can be rendered at (checked before anything is written)."""
    if size < 32 or size % 2:
        raise ValueError(f"frame size must be even and >= 32 pixels, got {size}")
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")


def make_spec(seed: int, *, min_len: float = 60, max_len: float = 600, fps: int = 2, size: int = 64,
              n_events: tuple[int, int] = (2, 5), event_len: tuple[float, float] = (1.0, 8.0),
              scene_len: tuple[float, float] = (20.0, 60.0), textures: bool = True,
              colour_repeat: float = 0.3) -> VideoSpec:
    """Sample a video: integer length, scenes, and non-overlapping events (2 s apart) with
    distinct (colour, shape) pairs. Colours repeat on purpose now and then (an event after the
    first takes an earlier event's colour with probability `colour_repeat`) so that counting
    questions have answers above one. Event times lie on a 0.5 s grid."""
    if not 0 < min_len <= max_len:
        raise ValueError(f"need 0 < min_len <= max_len, got {min_len}, {max_len}")
    if not 0 < event_len[0] <= event_len[1]:
        raise ValueError(f"bad event length range {event_len}")
    if max_len < event_len[1] + 4:
        raise ValueError(f"videos ({max_len} s at most) must be longer than the longest event plus 4 s")
    check_frame(size, fps)
    if not 0 <= colour_repeat <= 1:
        raise ValueError(f"colour_repeat must be in [0, 1], got {colour_repeat}")
    rng = np.random.default_rng(seed)
    duration = float(max(round(rng.uniform(min_len, max_len)), math.ceil(event_len[1] + 4)))
    # scenes; the first covers the first overview frame of every K >= CONTROL_MIN_K, so a
    # "background at the start" question is answerable from any overview (a control)
    scenes, t, prev = [], 0.0, None
    first_min = math.ceil(duration / (2 * CONTROL_MIN_K) + 1)
    while t < duration:
        length = float(round(rng.uniform(*scene_len)))
        if not scenes:
            length = max(length, first_min)
        colour = str(rng.choice([b for b in BACKGROUNDS if b != prev]))
        texture = str(rng.choice(TEXTURES)) if textures else "plain"
        end = min(duration, t + length)
        if duration - end < scene_len[0] / 2:  # no sliver of a scene at the very end
            end = duration
        scenes.append(Scene(colour, t, end, texture))
        prev, t = colour, end
    events: list[Event] = []
    used: set[tuple[str, str]] = set()
    n = int(rng.integers(n_events[0], n_events[1] + 1))
    for _ in range(n * 30):
        if len(events) == n:
            break
        d = max(event_len[0], float(round(rng.uniform(*event_len) * 2) / 2))
        start = float(round(rng.uniform(1.0, duration - d - 1.0) * 2) / 2)
        if any(start < e.end + 2 and e.start < start + d + 2 for e in events):
            continue  # keep events apart so each window shows one thing
        if events and rng.random() < colour_repeat:  # a colour seen before, with another shape
            colour = events[int(rng.integers(len(events)))].colour
        else:
            colour = str(rng.choice(list(COLOURS)))
        shape = str(rng.choice(SHAPES))
        if (colour, shape) in used:
            continue
        used.add((colour, shape))
        events.append(Event(shape, colour, str(rng.choice(list(POSITIONS))), start, start + d))
    events.sort(key=lambda e: e.start)
    return VideoSpec(seed=int(seed), duration=duration, fps=int(fps), size=int(size), scenes=scenes, events=events)


def _convex(dy: np.ndarray, dx: np.ndarray, pts: list[tuple[float, float]]) -> np.ndarray:
    """Inside a convex polygon given counter-clockwise in (x, y) with y down: all half-planes."""
    inside = np.ones(dy.shape, bool)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:] + pts[:1]):
        inside &= (x1 - x0) * (dy - y0) - (y1 - y0) * (dx - x0) <= 0
    return inside


def _star(dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """A five-pointed star: inner pentagon plus five spike triangles (each convex)."""
    outer = [(math.cos(a), math.sin(a)) for a in (-math.pi / 2 + 2 * math.pi * i / 5 for i in range(5))]
    inner = [(0.42 * math.cos(a), 0.42 * math.sin(a)) for a in (-math.pi / 2 + math.pi / 5 + 2 * math.pi * i / 5
                                                                for i in range(5))]
    mask = _convex(dy, dx, inner[::-1]) | _convex(dy, dx, inner)
    for i in range(5):
        tri = [inner[i - 1], outer[i], inner[i]]
        mask |= _convex(dy, dx, tri) | _convex(dy, dx, tri[::-1])
    return mask


def _mask(shape: str, size: int, cy: float, cx: float, r: float) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    dy, dx = (yy - cy) / r, (xx - cx) / r
    if shape == "circle":
        return dy**2 + dx**2 <= 1
    if shape == "square":
        return (np.abs(dy) <= 0.85) & (np.abs(dx) <= 0.85)
    if shape == "diamond":
        return np.abs(dy) + np.abs(dx) <= 1.1
    if shape == "triangle":
        return (dy <= 0.8) & (dy >= -1) & (np.abs(dx) <= (dy + 1) / 1.8 * 1.05)
    if shape == "cross":
        return ((np.abs(dy) <= 0.3) & (np.abs(dx) <= 1)) | ((np.abs(dx) <= 0.3) & (np.abs(dy) <= 1))
    if shape == "star":
        return _star(dy * 0.85, dx * 0.85)
    raise ValueError(f"unknown shape {shape!r}")


def event_mask(e: Event, size: int) -> np.ndarray:
    """Boolean HxW mask of the event's pixels in a size x size frame."""
    py, px = POSITIONS[e.position]
    return _mask(e.shape, size, py * size, px * size, size * SHAPE_RADIUS)


def background(scene: Scene, size: int) -> np.ndarray:
    base = np.array(BACKGROUNDS[scene.colour], np.int16)
    img = np.broadcast_to(base, (size, size, 3)).copy()
    yy, xx = np.mgrid[0:size, 0:size]
    period = max(4, size // 8)
    if scene.texture == "stripes":
        img += np.where(((xx + yy) // period) % 2 == 0, 10, -10)[..., None].astype(np.int16)
    elif scene.texture == "checks":
        img += np.where((xx // (2 * period) + yy // (2 * period)) % 2 == 0, 10, -10)[..., None].astype(np.int16)
    elif scene.texture != "plain":
        raise ValueError(f"unknown texture {scene.texture!r}")
    return np.clip(img, 0, 255).astype(np.uint8)


def render_frame(spec: VideoSpec, t: float) -> np.ndarray:
    """The frame shown at time t."""
    img = background(spec.scene_at(t), spec.size)
    for e in spec.events_at(t):
        img[event_mask(e, spec.size)] = COLOURS[e.colour]
    return img


def spec_fingerprint(spec: VideoSpec) -> str:
    """A short hash of everything that decides the pixels; written into the MP4 so a generator
    resuming into an existing folder re-renders a video whose spec has changed."""
    return hashlib.sha256(json.dumps(spec.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


FINGERPRINT_TAG = "paravt-spec:"


def video_fingerprint(path: str | Path) -> str | None:
    """The spec fingerprint stored in a video written by `write_video` (None if absent/unreadable)."""
    import av

    try:
        with av.open(str(path)) as c:
            comment = c.metadata.get("comment", "")
    except (av.FFmpegError, OSError):
        return None
    return comment[len(FINGERPRINT_TAG):] if comment.startswith(FINGERPRINT_TAG) else None


def write_video(spec: VideoSpec, path: str | Path, gop_s: float = 10.0) -> Path:
    """Encode the spec as H.264 MP4 (yuv420p, long GOP, B-frames), its fingerprint in the
    container's comment tag. Frames repeat between changes, so each distinct picture is rendered
    once and the cost is the encoder's: a 600 s video at 2 fps (1200 frames of 64x64) takes about
    half a second. The file appears only once complete (written under a temporary name, then
    renamed)."""
    import av

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part.mp4")
    n = int(round(spec.duration * spec.fps))
    try:
        with av.open(str(tmp), mode="w") as out:
            out.metadata["comment"] = FINGERPRINT_TAG + spec_fingerprint(spec)
            stream = out.add_stream("libx264", rate=Fraction(spec.fps, 1))
            stream.width = stream.height = spec.size
            stream.pix_fmt = "yuv420p"
            g = max(1, int(gop_s * spec.fps))
            stream.options = {"g": str(g), "keyint_min": str(g), "sc_threshold": "0", "preset": "veryfast",
                              "crf": "20", "threads": "1"}  # one thread: byte-identical output for a seed
            last_key, last_frame = None, None
            for i in range(n):
                t = i / spec.fps  # the frame at pts t shows the state at t
                key = (id(spec.scene_at(t)), tuple(id(e) for e in spec.events_at(t)))
                if key != last_key:
                    last_frame = av.VideoFrame.from_ndarray(render_frame(spec, t), format="rgb24")
                    last_key = key
                last_frame.pts = i
                last_frame.time_base = Fraction(1, spec.fps)
                for packet in stream.encode(last_frame):
                    out.mux(packet)
            for packet in stream.encode():
                out.mux(packet)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
