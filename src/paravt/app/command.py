"""`paravt app`: check the options, say where the page is, serve it until interrupted."""

from pathlib import Path
from typing import Optional

from paravt.app.routes import create_app
from paravt.webguard import h11_protocol, is_loopback
from paravt.app.settings import MAX_EPISODES, MAX_UPLOAD_MB, AppSettings


def serve_app(host: str = "127.0.0.1", port: int = 8080, media_root: Optional[str] = None,
              max_upload_mb: float = MAX_UPLOAD_MB, api_key: Optional[str] = None, model: Optional[str] = None,
              frames: int = 64, max_episodes: int = MAX_EPISODES) -> None:
    """`paravt app`: check the options, say where the page is, serve it until interrupted."""
    import uvicorn
    from rich.console import Console

    from paravt.agent import EpisodeConfig

    console = Console(stderr=True)
    root = None
    if media_root:
        root = Path(media_root).expanduser()
        if not root.is_dir():
            raise ValueError(f"--media-root {media_root}: not a directory")
    if not max_upload_mb > 0:
        raise ValueError(f"--max-upload-mb must be positive, got {max_upload_mb}")
    if max_episodes < 1:
        raise ValueError(f"--max-episodes must be >= 1, got {max_episodes}")
    EpisodeConfig(frames=frames)  # checks --frames now
    loopback = is_loopback(host)
    if not loopback and not api_key:
        console.print(f"[yellow]warning: listening on {host} without --api-key: anyone who can reach it can read "
                      "the videos under --media-root and make it load models[/yellow]")
    settings = AppSettings(media_root=root, max_upload_bytes=int(max_upload_mb * 1024 * 1024), api_key=api_key,
                           default_model=model, default_frames=frames, max_episodes=max_episodes,
                           loopback_hosts_only=loopback)
    shown = f"[{host}]" if ":" in host else host
    console.print(f"paravt app: open http://{shown}:{port}/"
                  + ("  (it asks for the API key; or add #key=KEY to the address)" if api_key else ""))
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning", http=h11_protocol())
