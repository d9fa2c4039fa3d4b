"""The one error a video raises: a file or URL that cannot be read, or a request outside it."""

from __future__ import annotations


class VideoError(Exception):
    """A video that cannot be read, or a request outside it. The message names the file."""
