"""The HTML report: what the model did in each sample of one or more eval runs.

`build_report(runs, "report.html")` writes one page (the data embedded as JSON) and a folder
beside it, `report_files/`, with the scripts, styles and small JPEG thumbnails: no CDN and no
server, so the page opens from disk and offline. `paravt eval report RUN... --html report.html`
is the command line for it.

The episode view (`assets/episode.js`, `renderEpisode(container, episode, opts)`) is a script of
its own that draws one `Episode.to_dict()`; the report uses it for every sample, and a live page
can call it again as an episode grows.
"""

from paravt.report.html import ASSETS, build_report

__all__ = ["ASSETS", "build_report"]
