"""Images of a request: base64 data URLs only (the server fetches nothing), their size read from
the header before any pixel is decoded, and decoded straight to the size the model will see.

The per-request limits (`ImageLimits`) are checked from the image headers before any pixel data
is decoded: `max_images` (--max-images, default 256) images in one request, else 400;
`max_total_pixels` (--max-total-pixels, default 256 x 1024^2 = 268 M pixels, ~800 MB as RGB)
their decoded pixels together, else 413; `max_image_pixels` (default 4096^2) one image, else 400.
An episode needs far less: 64 overview frames of up to 448x448 (13 M pixels) plus a turn of
crops (5 calls x 16 frames x 448x448 = 16 M).

The model's processor resizes every image to its pixel budget (224x224 at most for the tiny
model), so an image at least twice that size per side is shrunk while it is decoded (JPEG: the
decoder's DCT scaling, `Image.draft`; then PIL's `reduce` and a resize to exactly the processor's
size) instead of being held at full size until the model's prefill. Smaller images are passed as
sent. A 4096x4096 JPEG then never exists at full size; a PNG does, one image at a time, only
while it is decoded.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from paravt.backends.base import Backend, ImagePart
from paravt.serve.errors import PayloadError

MAX_IMAGE_PIXELS = 4096 * 4096
# what a chat client sends; nothing else reaches a Pillow decoder (EPS would hand untrusted PostScript
# to Ghostscript where it is installed)
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
MAX_IMAGES = 256
MAX_TOTAL_PIXELS = 256 * 1024 * 1024
# (width, height) of an image -> the (width, height) the model's processor resizes it to
ImageFit = Callable[[int, int], tuple[int, int]]


@dataclass(frozen=True)
class ImageLimits:
    """What one request's images may decode to (see paravt.serve.images)."""

    max_pixels: int = MAX_IMAGE_PIXELS  # one image
    max_images: int = MAX_IMAGES
    max_total_pixels: int = MAX_TOTAL_PIXELS  # all images of the request together

    def __post_init__(self) -> None:
        for name in ("max_pixels", "max_images", "max_total_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class PendingImage:
    """An image whose header is read and whose pixels are not decoded yet: what it will cost is known
    before it is decoded, so the server can reserve that much of its pixel budget first."""

    image: Any  # a lazily opened PIL image (a JPEG's draft scale already set)
    where: str  # messages[i].content[j], for errors
    parts: list  # the message's parts; the decoded ImagePart goes to parts[index]
    index: int
    target: tuple[int, int] | None = None  # (width, height) to shrink to while decoding; None: as sent

    @property
    def decode_pixels(self) -> int:
        """Pixels the decoder materialises (a JPEG's draft scale included)."""
        w, h = self.image.size
        return w * h

    @property
    def held_pixels(self) -> int:
        """Pixels the request holds once this image is decoded."""
        return self.target[0] * self.target[1] if self.target else self.decode_pixels


def open_image(url: str, max_pixels: int = MAX_IMAGE_PIXELS):
    """A base64 image data URL -> a lazily opened PIL image: only its header is read, so its size can
    be checked before any pixel is decoded. Anything but a data URL is refused: the server fetches nothing."""
    from PIL import Image

    if not isinstance(url, str) or not url.startswith("data:"):
        shown = url[:60] if isinstance(url, str) else type(url).__name__
        raise PayloadError(f"image_url must be a base64 data URL (data:image/...;base64,...), got {shown!r}; "
                           "this server never fetches URLs or opens files")
    header, sep, b64 = url.partition(",")
    if not sep or not header.startswith("data:image/") or not header.endswith(";base64"):
        raise PayloadError("image_url must be a base64 data URL of an image (data:image/png;base64,...)")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError) as e:
        raise PayloadError(f"image data URL is not valid base64: {e}") from None
    try:
        img = Image.open(io.BytesIO(raw), formats=IMAGE_FORMATS)  # lazy: reads the header only
        w, h = img.size
    except Exception as e:  # PIL raises many kinds (UnidentifiedImageError, OSError, DecompressionBombError, ...)
        raise PayloadError(f"image could not be decoded as {', '.join(IMAGE_FORMATS)}: {type(e).__name__}: "
                           f"{str(e)[:200]}") from None
    if w * h > max_pixels:
        raise PayloadError(f"image of {w}x{h} pixels is over the limit of {max_pixels} pixels")
    return img


def to_rgb(img, target: tuple[int, int] | None = None) -> np.ndarray:
    """Decode a lazily opened PIL image's pixels -> HxWx3 uint8 RGB; with `target` (width, height),
    shrunk to exactly that size while decoding (`plan_image` chose it and set a JPEG's draft)."""
    try:
        if target is not None:
            return np.asarray(_shrink(img, target))
        return np.asarray(img.convert("RGB"))
    except Exception as e:
        raise PayloadError(f"image could not be decoded: {type(e).__name__}: {e}") from None


def _shrink(img, target: tuple[int, int]):
    """Reduce by the largest integer factor that stays at or above `target` (a box filter: cheap, and it
    averages every source pixel), then resize to exactly `target` with the processors' bicubic."""
    from PIL import Image

    factor = min(img.width // target[0], img.height // target[1])
    if factor >= 2:
        if img.mode not in ("RGB", "RGBA", "L", "LA"):  # what `reduce` takes; palette and CMYK convert first
            img = img.convert("RGB")
        img = img.reduce(factor)
    img = img.convert("RGB")
    return img if img.size == target else img.resize(target, Image.Resampling.BICUBIC)


def model_image_fit(backend: Backend) -> ImageFit | None:
    """The size the backend's model will resize an image to, for backends that can say (hf: its
    renderer's smart resize, exactly what its processor does), else None (a proxy, a test fake):
    their images are decoded as sent."""
    size = getattr(getattr(backend, "renderer", None), "image_size", None)
    if size is None:
        return None

    def fit(width: int, height: int) -> tuple[int, int]:
        try:  # a broadcast view stands in for the image: its shape is all image_size reads, no pixel is allocated
            h, w = size(np.broadcast_to(np.zeros(3, np.uint8), (height, width, 3)))
        except Exception:  # noqa: BLE001 - e.g. an extreme aspect ratio: decoded as sent, the model refuses it
            return width, height
        return w, h

    return fit


def plan_image(img, fit: ImageFit | None) -> tuple[int, int] | None:
    """The (width, height) to decode a lazily opened image to, or None to decode it as sent. Only an
    image at least twice the model's size per side is shrunk here (the processor would resize it anyway;
    smaller ones keep the processor's own resize, so ordinary frames are fed exactly as before). A JPEG's
    decoder is told to scale by 1/2..1/8 in the DCT (`draft`), so it never decodes the full size."""
    if fit is None:
        return None
    w, h = img.size
    tw, th = fit(w, h)
    if tw < 1 or th < 1 or w < 2 * tw or h < 2 * th:
        return None
    if img.format == "JPEG":
        img.draft("RGB", (tw, th))  # picks the smallest scale that is still >= (tw, th)
    return tw, th


def decode_pending(pending: list[PendingImage]) -> None:
    """Decode the images in place, one at a time (each is shrunk before the next is decoded), and
    drop each compressed image once decoded."""
    for p in pending:
        try:
            p.parts[p.index] = ImagePart(to_rgb(p.image, p.target))
        except PayloadError as e:
            raise PayloadError(f"{p.where}: {e}") from None
        finally:
            p.image.close()


def decode_image(url: str, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """A base64 image data URL -> HxWx3 uint8 RGB (size checked from the header first)."""
    return to_rgb(open_image(url, max_pixels))
