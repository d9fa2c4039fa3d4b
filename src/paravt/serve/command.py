"""`paravt serve`: load a checkpoint into the in-process hf backend and serve it with uvicorn.
Binds 127.0.0.1 unless told otherwise; a non-loopback bind without --api-key is warned about."""

from __future__ import annotations

from pathlib import Path

from paravt.serve.app import create_app
from paravt.serve.images import MAX_IMAGES, MAX_TOTAL_PIXELS, ImageLimits
from paravt.serve.limits import MAX_INFLIGHT_PIXELS
from paravt.webguard import h11_protocol, is_ip, is_loopback, origin_of


def serve(model: str | None, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          max_batch: int = 16, max_model_len: int | None = None, max_images: int = MAX_IMAGES,
          max_total_pixels: int = MAX_TOTAL_PIXELS, rl_api: bool = False,
          max_inflight_pixels: int = MAX_INFLIGHT_PIXELS, allow_origins: tuple[str, ...] = (),
          allow_hosts: tuple[str, ...] = ()) -> None:
    """Load the model and serve it until interrupted. Without `model`, the default of `ask`, `eval`
    and `demo`: $PARAVT_MODEL, else the shipped trained tiny checkpoint (an untrained tiny model only
    if that is missing). `max_model_len` (None: the model's own) goes to the backend, which rejects
    longer prompts (400). The limits are checked before the model loads, so a typo fails fast."""
    import uvicorn
    from rich.console import Console

    from paravt.ask import default_model
    from paravt.backends.hf import HFBackend
    from paravt.models import load_model

    limits = ImageLimits(max_images=max_images, max_total_pixels=max_total_pixels)
    allow_origins = tuple(origin_of(o) for o in allow_origins)  # a typo fails here, before the model loads
    named = hosts_without_key(host, api_key, allow_hosts)
    if max_model_len is not None and max_model_len < 1:
        raise ValueError(f"max_model_len must be >= 1, got {max_model_len}")
    if max_inflight_pixels < 1:
        raise ValueError(f"max_inflight_pixels must be >= 1, got {max_inflight_pixels}")
    console = Console(stderr=True)
    given = model
    model = model or default_model()
    if model and model.startswith(("http://", "https://")):
        where = "--model" if given else "$PARAVT_MODEL"
        raise ValueError(f"{where} is a URL ({model}); paravt serve serves a checkpoint directory or a cached hub id")
    if model:
        if not given:
            console.print(f"[yellow]no --model given: serving {model} (paravt's default model; the shipped one is a "
                          "1.4 M-parameter toy trained on SynthVT only). Pass --model for a real checkpoint.[/yellow]")
        m, p = load_model(model)
        # a local directory is served under its folder name, a hub id under itself (as vLLM does)
        name = Path(model).expanduser().resolve().name if Path(model).expanduser().exists() else model
    else:
        from paravt.models.tiny import build_tiny

        console.print("[yellow]no --model given and no shipped model found: serving an untrained tiny Qwen3-VL "
                      "(its output is noise)[/yellow]")
        m, p = build_tiny()
        name = "tiny-untrained"
    loopback = is_loopback(host)
    if named is not None:
        console.print(f"[yellow]warning: listening on {host} without --api-key: anyone who can reach it can use it "
                      f"(it answers as an IP address or as {', '.join(named)} only, so no web page can reach it "
                      "through a name of its own)[/yellow]")
    console.print(f"paravt serve: model [bold]{name}[/bold] at http://{host}:{port}/v1 (max batch {max_batch})")
    backend = HFBackend(m, p, max_batch=max_batch, max_model_len=max_model_len)
    if rl_api:
        console.print("RL weight-sync API on: /pause, /resume, /collective_rpc reload_weights, /weight_info")
    app = create_app(backend, name, api_key=api_key, max_images=limits.max_images,
                     max_total_pixels=limits.max_total_pixels, rl_api=rl_api, max_inflight_pixels=max_inflight_pixels,
                     loopback_only=loopback, allowed_origins=allow_origins, named_hosts=named)
    uvicorn.run(app, host=host, port=port, log_level="warning", http=h11_protocol())


def hosts_without_key(host: str, api_key: str | None, allow_hosts: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """The names a server bound beyond loopback without a key answers as, besides IP addresses
    (paravt.webguard: a DNS-rebinding page reaches it only under a name of the page's own); None
    where no such check is needed (loopback, checked as such; or a key a page cannot know)."""
    import socket

    if is_loopback(host) or api_key:
        return None
    names = {socket.gethostname(), socket.getfqdn(), *allow_hosts}
    if not is_ip(host):
        names.add(host)
    return tuple(sorted(n.lower().rstrip(".") for n in names if n))
