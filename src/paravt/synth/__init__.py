"""SynthVT: procedural long videos with sparse short events, questions whose answers need
those events (plus overview-answerable controls), and oracle trajectories for cold-start SFT.

Modules: render (specs, shapes, H.264 writer), questions (mcq / tvg / oe + controls, visibility,
sub-agent summaries), oracle (trajectories and their SFT rows), dataset (a split on disk),
commands (`paravt synth`). Imports stay inside the modules so `import paravt.synth.render`
does not pull in the episode loop."""
