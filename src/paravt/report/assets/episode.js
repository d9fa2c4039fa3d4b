/*
 * paravt episode view: draws one agent episode, i.e. paravt.agent.Episode.to_dict().
 *
 *   <link rel="stylesheet" href="episode.css">
 *   <script src="episode.js"></script>
 *   paravt.renderEpisode(container, episode, opts)      // returns container
 *
 * A classic script, not an ES module: a page opened from disk (file://) cannot import modules.
 * It defines globalThis.paravt.renderEpisode (and module.exports under CommonJS); no dependencies.
 *
 * episode: Episode.to_dict(); token ids are neither needed nor read. Optionally also:
 *   thumbnails: [{t, src, w, h}]    overview frames as images: t in video seconds, w/h their pixel size
 *   truth:      [[start, end], ...]  where the evidence is (video seconds), drawn as a green band
 * Every field is optional, so that a live page can pass an episode while it runs:
 *   question, question_type, video, duration, overview_times, config {mode, frames}, answer, error,
 *   wall_time, n_parsed_calls, n_executed_calls, turns[]:
 *     turn: {index, forced_answer,
 *            generation {prefix, text, started, finished, prompt_tokens, completion_tokens,
 *                        finish_reason, prompt: [{role, content}]}   (absent: still generating)
 *            parsed {think, answer, problems}                         (absent: read from the text)
 *            calls[]: {index, call {arguments}, start, end, status, error, response, frame_times,
 *                      started, finished, generation}}
 *     call status: "ok" | "error" | "skipped" | "running" (or absent: running). A call with no
 *     start/end yet but with call.arguments.start_time/end_time is drawn there, dashed.
 *   Times in generation/call started/finished are seconds since the episode started.
 * opts (all optional):
 *   label     a title above the view (a run's name)
 *   expected  the reference answer; correct: true | false marks the answer; score: a number
 *   note      a line under the time axis (why there are no thumbnails, ...)
 *   live      true: a missing answer reads "running..." instead of "no answer"
 *
 * Call renderEpisode again on the same container with the grown episode (a turn or a call
 * arrived): it redraws in place and keeps the sections the reader opened (prompts, raw output).
 *
 * Hooks for scripts and tests: .pv-episode; crop windows svg rect.pv-crop[data-turn][data-index]
 * [data-start][data-end][data-status]; evidence rect.pv-truth[data-start][data-end]; overview
 * thumbnails image.pv-thumb[data-t]; overview ticks line.pv-ov-tick[data-t]; call cards
 * .pv-call[data-turn][data-index]; main turns section.pv-turn[data-turn].
 */
(function (root) {
  "use strict";

  var SVGNS = "http://www.w3.org/2000/svg";
  var XLINK = "http://www.w3.org/1999/xlink";
  var TURN_COLOURS = ["#1f77b4", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"];
  var uid = 0; // svg pattern ids must be unique in the page

  // ---------------------------------------------------------------------------- small helpers

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    setAll(node, attrs);
    append(node, children);
    return node;
  }

  function sv(tag, attrs, children) {
    var node = document.createElementNS(SVGNS, tag);
    setAll(node, attrs);
    append(node, children);
    return node;
  }

  function setAll(node, attrs) {
    if (!attrs) return;
    Object.keys(attrs).forEach(function (k) {
      var v = attrs[k];
      if (v === undefined || v === null || v === false) return;
      if (k === "text") node.textContent = String(v);
      else if (k.slice(0, 2) === "on") node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, String(v));
    });
  }

  function append(node, children) {
    if (children === undefined || children === null) return;
    if (!Array.isArray(children)) children = [children];
    children.forEach(function (c) {
      if (c === undefined || c === null || c === false) return;
      node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    });
  }

  function num(x) {
    return typeof x === "number" && isFinite(x);
  }

  function secs(t) {
    // a video time as the model wrote it: 15, 27.5, 3.25
    if (!num(t)) return "?";
    return String(Math.round(t * 100) / 100);
  }

  function took(s) {
    if (!num(s)) return "";
    if (s < 10) return s.toFixed(2) + " s";
    if (s < 120) return s.toFixed(1) + " s";
    return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  }

  function basename(p) {
    return String(p || "").split(/[\\/]/).pop();
  }

  function niceStep(span, target) {
    var raw = span / Math.max(1, target);
    var steps = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];
    for (var i = 0; i < steps.length; i++) if (steps[i] >= raw) return steps[i];
    return steps[steps.length - 1];
  }

  function clockLabel(t, step) {
    if (step >= 60 && t >= 60) {
      var m = Math.floor(t / 60), s = Math.round(t % 60);
      return m + ":" + (s < 10 ? "0" : "") + s;
    }
    return secs(t);
  }

  // ---------------------------------------------------------------------------- reading the episode

  function turnsOf(ep) {
    return Array.isArray(ep.turns) ? ep.turns : [];
  }

  function callsOf(turn) {
    return Array.isArray(turn.calls) ? turn.calls : [];
  }

  function windowOf(call) {
    // [start, end, tentative]: the validated window, else what the model asked for
    if (num(call.start) && num(call.end)) return [call.start, call.end, false];
    var a = call.call && call.call.arguments;
    if (a && typeof a === "object" && a.start_time != null && a.end_time != null) {
      var s = Number(a.start_time), e = Number(a.end_time);
      if (isFinite(s) && isFinite(e) && e > s) return [s, e, true];
    }
    return null;
  }

  function statusOf(call) {
    return call.status || "running";
  }

  function parsedOf(turn) {
    // the turn's think and answer; a live page may send only the generated text
    var p = turn.parsed || {};
    var g = turn.generation || {};
    var think = p.think, answer = p.answer;
    if (!turn.parsed && typeof g.text === "string") {
      var full = (g.prefix || "") + g.text;
      var m = /<think>([\s\S]*?)(<\/think>|$)/.exec(full);
      if (m) think = m[1].trim();
      var a = /<answer>([\s\S]*?)(<\/answer>|$)/.exec(full);
      if (a) answer = a[1].trim();
    }
    return {think: think, answer: answer, problems: p.problems || []};
  }

  function durationOf(ep) {
    if (num(ep.duration) && ep.duration > 0) return ep.duration;
    var most = 0;
    (ep.overview_times || []).forEach(function (t) { most = Math.max(most, t); });
    turnsOf(ep).forEach(function (t) {
      callsOf(t).forEach(function (c) {
        var w = windowOf(c);
        if (w) most = Math.max(most, w[1]);
      });
    });
    return most || 1;
  }

  // ---------------------------------------------------------------------------- the head

  function head(ep, opts) {
    var cfg = ep.config || {};
    var nodes = [];
    if (opts.label) nodes.push(el("h3", {class: "pv-label", text: opts.label}));
    if (ep.question) nodes.push(el("div", {class: "pv-question", text: ep.question}));
    var answered = ep.answer !== undefined && ep.answer !== null;
    var mark = opts.correct === true ? el("span", {class: "pv-badge pv-ok", text: "right"}) :
      opts.correct === false ? el("span", {class: "pv-badge pv-bad", text: "wrong"}) : null;
    var line = [el("span", {class: "pv-k", text: "answer "}),
      el("span", {class: "pv-answer" + (answered ? "" : " pv-dim"),
        text: answered ? String(ep.answer) : (opts.live ? "running..." : "no answer")}), " ", mark];
    if (opts.expected !== undefined && opts.expected !== null) {
      line.push(el("span", {class: "pv-k", text: "  expected "}), el("span", {class: "pv-expected", text: String(opts.expected)}));
    }
    if (num(opts.score)) line.push(el("span", {class: "pv-dim", text: "  score " + opts.score.toFixed(2)}));
    nodes.push(el("div", {class: "pv-answer-line"}, line));
    var chips = [];
    if (ep.video) chips.push(["video", basename(ep.video)]);
    if (num(ep.duration)) chips.push(["duration", secs(ep.duration) + " s"]);
    if (cfg.mode) chips.push(["mode", cfg.mode]);
    var k = (ep.overview_times || []).length || cfg.frames;
    if (k) chips.push(["K", String(k)]);
    chips.push(["turns", String(turnsOf(ep).length)]);
    if (num(ep.n_parsed_calls)) chips.push(["crops run", (ep.n_executed_calls || 0) + " of " + ep.n_parsed_calls + " asked"]);
    if (num(ep.wall_time) && ep.wall_time > 0) chips.push(["time", took(ep.wall_time)]);
    nodes.push(el("div", {class: "pv-chips"}, chips.map(function (c) {
      return el("span", {class: "pv-chip", title: c[0] === "video" ? ep.video : null}, [el("span", {class: "pv-k", text: c[0] + " "}), c[1]]);
    })));
    if (ep.error) nodes.push(el("div", {class: "pv-error", text: ep.error}));
    return el("div", {class: "pv-head"}, nodes);
  }

  // ---------------------------------------------------------------------------- the time axis

  function lanes(items) {
    // items: [{s, e}] -> lane index per item, so that overlapping windows of one turn stack
    var ends = [], out = [];
    items.forEach(function (it) {
      var lane = 0;
      while (lane < ends.length && ends[lane] > it.s + 1e-9) lane++;
      ends[lane] = it.e;
      out.push(lane);
    });
    return {lane: out, n: Math.max(1, ends.length)};
  }

  // a thumbnail is a data: image or a file beside the page (report_files/...), never a remote URL
  function localImage(th) {
    var src = th && typeof th.src === "string" ? th.src : "";
    if (/^data:image\/(jpeg|png|webp);base64,/.test(src)) return true;
    return src !== "" && !/^[a-z][a-z0-9+.\-]*:/i.test(src) && !/^[\/\\]/.test(src) && src.indexOf("..") < 0;
  }

  function timeline(ep, opts, width, onPick) {
    var D = durationOf(ep);
    var L = 86, R = 14, W = Math.max(360, width);
    var x = function (t) { return L + (Math.max(0, Math.min(D, t)) / D) * (W - L - R); };
    var thumbs = Array.isArray(ep.thumbnails) ? ep.thumbnails.filter(localImage).sort(function (a, b) { return a.t - b.t; }) : [];
    var OH = thumbs.length ? 50 : 20, LANE = 20, PAD = 6;
    var turns = turnsOf(ep);
    var rows = turns.map(function (t) {
      var cs = callsOf(t).map(function (c) { return {c: c, w: windowOf(c)}; }).filter(function (o) { return o.w; });
      cs.sort(function (a, b) { return a.w[0] - b.w[0]; });
      var ln = lanes(cs.map(function (o) { return {s: o.w[0], e: o.w[1]}; }));
      return {turn: t, calls: cs, lane: ln.lane, h: ln.n * LANE + PAD};
    });
    var top = 16; // room for the evidence label
    var y = top + OH;
    rows.forEach(function (r) { r.y = y; y += r.h; });
    var axisY = y + 4, H = axisY + 22;
    var pid = "pv-hatch-" + (++uid);
    var s = sv("svg", {class: "pv-timeline", width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img",
      "aria-label": "where the agent looked, on the video's time axis"});
    s.appendChild(sv("defs", null, sv("pattern", {id: pid, width: 6, height: 6, patternUnits: "userSpaceOnUse",
      patternTransform: "rotate(45)"}, [sv("rect", {width: 6, height: 6, fill: "#e4e4e4"}),
      sv("line", {x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#999", "stroke-width": 2})])));

    // row labels and guides
    s.appendChild(sv("text", {x: 4, y: top + OH / 2 + 4, class: "pv-rowlabel", text: "overview K=" + (ep.overview_times || []).length}));
    rows.forEach(function (r) {
      var t = r.turn;
      s.appendChild(sv("line", {x1: L, x2: W - R, y1: r.y, y2: r.y, class: "pv-guide"}));
      s.appendChild(sv("text", {x: 4, y: r.y + Math.min(r.h, LANE) / 2 + 4, class: "pv-rowlabel",
        text: "turn " + ((t.index !== undefined ? t.index : rows.indexOf(r)) + 1) + (t.forced_answer ? " (final)" : "")}));
    });

    // where the evidence is
    (ep.truth || []).forEach(function (span, i) {
      if (!span || !num(span[0]) || !num(span[1])) return;
      var x0 = x(span[0]), x1 = x(span[1]);
      s.appendChild(sv("rect", {class: "pv-truth", x: x0, y: top - 2, width: Math.max(2, x1 - x0), height: axisY - top + 2,
        "data-start": span[0], "data-end": span[1]}, sv("title", {text: "evidence: " + secs(span[0]) + "-" + secs(span[1]) + " s"})));
      if (i === 0) s.appendChild(sv("text", {class: "pv-truth-label", x: x0 + 2, y: top - 5, text: "evidence " + secs(span[0]) + "-" + secs(span[1]) + " s"}));
    });

    // overview: a tick per frame the model saw, thumbnails where there are
    (ep.overview_times || []).forEach(function (t) {
      s.appendChild(sv("line", {class: "pv-ov-tick", x1: x(t), x2: x(t), y1: top + OH - 8, y2: top + OH, "data-t": t},
        sv("title", {text: "overview frame at " + secs(t) + " s"})));
    });
    thumbs.forEach(function (th, i) {
      var aspect = num(th.w) && num(th.h) && th.h > 0 ? th.w / th.h : 16 / 9;
      var h = OH - 12, w = h * aspect;
      var left = i > 0 ? x(th.t) - x(thumbs[i - 1].t) : Infinity;
      var right = i < thumbs.length - 1 ? x(thumbs[i + 1].t) - x(th.t) : Infinity;
      var room = Math.min(left, right) - 2;
      if (w > room) { w = Math.max(6, room); h = w / aspect; }
      var cx = Math.max(L + w / 2, Math.min(W - R - w / 2, x(th.t)));
      var img = sv("image", {class: "pv-thumb", x: cx - w / 2, y: top + (OH - 10 - h), width: w, height: h,
        preserveAspectRatio: "xMidYMid slice", "data-t": th.t}, sv("title", {text: "frame at " + secs(th.t) + " s"}));
      img.setAttribute("href", th.src);
      img.setAttributeNS(XLINK, "xlink:href", th.src);
      s.appendChild(img);
    });

    // crop windows, per turn
    rows.forEach(function (r) {
      var ti = r.turn.index !== undefined ? r.turn.index : rows.indexOf(r);
      var colour = TURN_COLOURS[ti % TURN_COLOURS.length];
      r.calls.forEach(function (o, j) {
        var c = o.c, w = o.w, st = statusOf(c);
        var x0 = x(w[0]), x1 = x(w[1]);
        var yy = r.y + PAD / 2 + r.lane[j] * LANE;
        var fill = st === "ok" ? colour : st === "running" ? "none" : "url(#" + pid + ")";
        var rect = sv("rect", {class: "pv-crop pv-st-" + st + (w[2] ? " pv-tentative" : ""), x: x0, y: yy,
          width: Math.max(2, x1 - x0), height: LANE - 4, rx: 2, fill: fill, stroke: st === "ok" ? "#fff" : "#777",
          "data-turn": ti, "data-index": c.index, "data-start": w[0], "data-end": w[1], "data-status": st,
          tabindex: 0, onclick: function () { onPick(ti, c.index); },
          onkeydown: function (e) { if (e.key === "Enter") onPick(ti, c.index); }},
          sv("title", {text: "call " + (ti + 1) + "." + (c.index + 1) + ": " + secs(w[0]) + "-" + secs(w[1]) + " s, " + st +
            (c.response ? "\n" + String(c.response).slice(0, 300) : "") + (c.error ? "\n" + c.error : "")}));
        s.appendChild(rect);
        var label = secs(w[0]) + "-" + secs(w[1]);
        if (x1 - x0 > label.length * 6 + 6) {
          s.appendChild(sv("text", {class: "pv-crop-label" + (st === "ok" ? "" : " pv-dark"), x: x0 + 3, y: yy + LANE / 2 + 2, text: label}));
        }
      });
      var p = parsedOf(r.turn);
      var tail = !r.calls.length ? (p.answer !== undefined && p.answer !== null ? "answered: " + String(p.answer).slice(0, 60) :
        r.turn.generation ? "no crop" : "generating...") : "";
      if (tail) s.appendChild(sv("text", {class: "pv-row-note", x: L + 4, y: r.y + LANE / 2 + 4, text: tail}));
    });

    // the axis
    s.appendChild(sv("line", {class: "pv-axis", x1: L, x2: W - R, y1: axisY, y2: axisY}));
    var step = niceStep(D, Math.floor((W - L - R) / 70));
    for (var t = 0; t <= D + 1e-9; t += step) {
      s.appendChild(sv("line", {class: "pv-axis", x1: x(t), x2: x(t), y1: axisY, y2: axisY + 4}));
      s.appendChild(sv("text", {class: "pv-tick", x: x(t), y: axisY + 15, "text-anchor": "middle", text: clockLabel(t, step)}));
    }
    return s;
  }

  // ---------------------------------------------------------------------------- the turns

  function messages(list, previous) {
    // the prompt's messages; those the previous main turn's prompt began with are folded away
    list = Array.isArray(list) ? list : [];
    var same = 0;
    if (Array.isArray(previous)) {
      while (same < previous.length && same < list.length && previous[same].role === list[same].role &&
             previous[same].content === list[same].content) same++;
    }
    var out = [];
    if (same > 0) out.push(el("div", {class: "pv-dim pv-same", text: "(the " + same + " message" + (same > 1 ? "s" : "") +
      " of the previous turn's prompt, then:)"}));
    list.slice(same).forEach(function (m) {
      out.push(el("div", {class: "pv-msg pv-role-" + m.role}, [el("div", {class: "pv-role", text: m.role}),
        el("pre", {class: "pv-pre", text: m.content === undefined || m.content === null ? "" : String(m.content)})]));
    });
    return out;
  }

  function details(key, summary, body, open) {
    return el("details", {"data-key": key, open: open ? "" : null}, [el("summary", {text: summary})].concat(body));
  }

  function miniAxis(w, D) {
    // the call's window on the whole video, beside its summary
    var W = 160, H = 10;
    var s = sv("svg", {class: "pv-mini", width: W, height: H, viewBox: "0 0 " + W + " " + H});
    s.appendChild(sv("rect", {x: 0, y: 3, width: W, height: 4, class: "pv-mini-track"}));
    if (w) {
      var x0 = (Math.max(0, w[0]) / D) * W, x1 = (Math.min(D, w[1]) / D) * W;
      s.appendChild(sv("rect", {x: x0, y: 0, width: Math.max(2, x1 - x0), height: H, class: "pv-mini-win"}));
    }
    return s;
  }

  function callCard(c, ti, colour, D) {
    var st = statusOf(c), w = windowOf(c);
    var span = w ? secs(w[0]) + "-" + secs(w[1]) + " s" : "no window";
    var facts = [st];
    if (Array.isArray(c.frame_times) && c.frame_times.length) facts.push(c.frame_times.length + " frames");
    if (num(c.started) && num(c.finished) && c.finished >= c.started && st !== "running") facts.push(took(c.finished - c.started));
    var g = c.generation || {};
    var body = [];
    if (c.response && st === "ok") body.push(el("div", {class: "pv-summary", text: c.response}));
    else if (c.error) body.push(el("div", {class: "pv-call-error", text: c.error}));
    else if (st === "running") body.push(el("div", {class: "pv-dim", text: "the sub-agent is watching its window..."}));
    var more = [];
    if (g.prompt) more.push(details("t" + ti + "c" + c.index + "p", "sub-agent prompt", messages(g.prompt)));
    if (g.text !== undefined && g.text !== c.response) more.push(details("t" + ti + "c" + c.index + "r", "sub-agent raw output",
      [el("pre", {class: "pv-pre", text: (g.prefix || "") + g.text})]));
    if (!w && c.call && c.call.raw) more.push(details("t" + ti + "c" + c.index + "w", "the call as written",
      [el("pre", {class: "pv-pre", text: c.call.raw})]));
    return el("div", {class: "pv-call pv-st-" + st, "data-turn": ti, "data-index": c.index}, [
      el("div", {class: "pv-call-window"}, [
        el("div", {class: "pv-call-title"}, [el("span", {class: "pv-swatch", style: "background:" + (st === "ok" ? colour : "#bbb")}),
          "call " + (ti + 1) + "." + (c.index + 1) + "  ", el("b", {text: span})]),
        miniAxis(w, D), el("div", {class: "pv-dim", text: facts.join(" · ")})]),
      el("div", {class: "pv-call-body"}, body.concat(more))]);
  }

  function turnSection(turn, i, prevPrompt, D) {
    var ti = turn.index !== undefined ? turn.index : i;
    var colour = TURN_COLOURS[ti % TURN_COLOURS.length];
    var g = turn.generation;
    var facts = ["main agent"];
    if (g) {
      if (num(g.started) && num(g.finished)) facts.push(took(g.finished - g.started));
      if (num(g.prompt_tokens)) facts.push(g.prompt_tokens + " prompt tokens" + (num(g.visual_tokens) && g.visual_tokens ? " (" + g.visual_tokens + " visual)" : ""));
      if (num(g.completion_tokens)) facts.push(g.completion_tokens + " generated");
      if (g.finish_reason && g.finish_reason !== "stop") facts.push("finish: " + g.finish_reason);
    }
    var p = parsedOf(turn);
    var nodes = [el("h4", null, [el("span", {class: "pv-swatch", style: "background:" + colour}), "Turn " + (ti + 1) + " ",
      el("span", {class: "pv-dim", text: facts.join(" · ")}), turn.forced_answer ? el("span", {class: "pv-badge", text: "answer now"}) : null])];
    if (!g) nodes.push(el("div", {class: "pv-dim", text: "the main agent is generating..."}));
    if (p.think) nodes.push(el("div", {class: "pv-think"}, [el("span", {class: "pv-tag", text: "think"}), el("div", {class: "pv-text", text: p.think})]));
    if (p.answer !== undefined && p.answer !== null) nodes.push(el("div", {class: "pv-said-answer"}, [el("span", {class: "pv-tag", text: "answer"}),
      el("div", {class: "pv-text", text: String(p.answer)})]));
    if (p.problems && p.problems.length) nodes.push(el("ul", {class: "pv-problems"}, p.problems.map(function (pr) {
      return el("li", {text: "format problem: " + (typeof pr === "string" ? pr : (pr.kind || "") + (pr.detail ? ": " + pr.detail : ""))});
    })));
    var calls = callsOf(turn);
    if (calls.length) nodes.push(el("div", {class: "pv-calls"}, calls.map(function (c) { return callCard(c, ti, colour, D); })));
    var more = [];
    if (g && g.prompt) more.push(details("t" + ti + "p", "prompt · " + g.prompt.length + " message" + (g.prompt.length === 1 ? "" : "s"),
      messages(g.prompt, prevPrompt)));
    if (g && typeof g.text === "string") more.push(details("t" + ti + "r", "raw output", [el("pre", {class: "pv-pre", text: (g.prefix || "") + g.text})]));
    if (turn.tool_response) more.push(details("t" + ti + "tr", "what the main agent got back", [el("pre", {class: "pv-pre", text: turn.tool_response})]));
    if (more.length) nodes.push(el("div", {class: "pv-more"}, more));
    return el("section", {class: "pv-turn", "data-turn": ti}, nodes);
  }

  // ---------------------------------------------------------------------------- wall-clock timings

  function timings(ep, width) {
    var rows = [];
    turnsOf(ep).forEach(function (t, i) {
      var ti = t.index !== undefined ? t.index : i;
      var g = t.generation;
      if (g && num(g.started) && num(g.finished)) rows.push({label: "main " + (ti + 1), span: null, gen: [g.started, g.finished], colour: TURN_COLOURS[ti % TURN_COLOURS.length]});
      callsOf(t).forEach(function (c) {
        if (statusOf(c) === "skipped" || !num(c.started) || !num(c.finished)) return;
        var cg = c.generation;
        rows.push({label: "  call " + (ti + 1) + "." + (c.index + 1), span: [c.started, c.finished],
          gen: cg && num(cg.started) && num(cg.finished) ? [cg.started, cg.finished] : null,
          colour: statusOf(c) === "ok" ? TURN_COLOURS[ti % TURN_COLOURS.length] : "#999"});
      });
    });
    if (!rows.length) return null;
    var end = num(ep.wall_time) && ep.wall_time > 0 ? ep.wall_time : 0;
    rows.forEach(function (r) { end = Math.max(end, (r.span || r.gen)[1], r.gen ? r.gen[1] : 0); });
    end = end || 1;
    var L = 86, R = 14, W = Math.max(360, width), RH = 14, H = rows.length * RH + 26;
    var x = function (t) { return L + (Math.max(0, t) / end) * (W - L - R); };
    var s = sv("svg", {class: "pv-timings", width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img",
      "aria-label": "wall-clock time of each model call"});
    rows.forEach(function (r, i) {
      var yy = 4 + i * RH;
      s.appendChild(sv("text", {class: "pv-rowlabel", x: 4, y: yy + 10, text: r.label}));
      if (r.span) s.appendChild(sv("rect", {x: x(r.span[0]), y: yy + 1, width: Math.max(1, x(r.span[1]) - x(r.span[0])), height: RH - 2,
        fill: r.colour, opacity: 0.3}, sv("title", {text: r.label.trim() + ": " + took(r.span[1] - r.span[0]) + " in all"})));
      if (r.gen) s.appendChild(sv("rect", {x: x(r.gen[0]), y: yy + 3, width: Math.max(1, x(r.gen[1]) - x(r.gen[0])), height: RH - 6,
        fill: r.colour}, sv("title", {text: r.label.trim() + ": generation " + took(r.gen[1] - r.gen[0])})));
    });
    var axisY = rows.length * RH + 6;
    s.appendChild(sv("line", {class: "pv-axis", x1: L, x2: W - R, y1: axisY, y2: axisY}));
    var step = niceStep(end, Math.floor((W - L - R) / 70));
    for (var t = 0; t <= end + 1e-9; t += step) {
      s.appendChild(sv("line", {class: "pv-axis", x1: x(t), x2: x(t), y1: axisY, y2: axisY + 4}));
      s.appendChild(sv("text", {class: "pv-tick", x: x(t), y: axisY + 15, "text-anchor": "middle", text: secs(t)}));
    }
    return s;
  }

  // ---------------------------------------------------------------------------- entry point

  function renderEpisode(container, episode, opts) {
    opts = opts || {};
    var ep = episode || {};
    var open = {};
    Array.prototype.forEach.call(container.querySelectorAll("details[data-key]"), function (d) {
      open[d.getAttribute("data-key")] = d.open;
    });
    while (container.firstChild) container.removeChild(container.firstChild);
    var root = el("div", {class: "pv-episode"});
    container.appendChild(root);
    var width = Math.floor(container.clientWidth || root.clientWidth || 900) - 2;
    var D = durationOf(ep);

    function pick(turn, index) {
      var card = root.querySelector('.pv-call[data-turn="' + turn + '"][data-index="' + index + '"]');
      if (!card) return;
      card.scrollIntoView({block: "nearest", behavior: "smooth"});
      card.classList.remove("pv-flash");
      void card.offsetWidth; // restart the animation
      card.classList.add("pv-flash");
    }

    root.appendChild(head(ep, opts));
    root.appendChild(el("div", {class: "pv-figure"}, timeline(ep, opts, width, pick)));
    var legend = ["crop windows per turn (click one for its summary)", "grey hatched: failed or skipped", "ticks: overview frames"];
    if ((ep.truth || []).length) legend.push("green: where the evidence is");
    root.appendChild(el("div", {class: "pv-legend pv-dim", text: legend.join(" · ")}));
    if (opts.note) root.appendChild(el("div", {class: "pv-note", text: opts.note}));
    var turns = turnsOf(ep);
    var prev = null;
    root.appendChild(el("div", {class: "pv-turns"}, turns.map(function (t, i) {
      var sec = turnSection(t, i, prev, D);
      prev = t.generation && t.generation.prompt;
      return sec;
    })));
    var tm = timings(ep, width);
    if (tm) root.appendChild(details("timings", "timings (wall clock since the episode started; light: the whole call, dark: its generation)",
      [el("div", {class: "pv-figure"}, tm)], true));
    Array.prototype.forEach.call(root.querySelectorAll("details[data-key]"), function (d) {
      var k = d.getAttribute("data-key");
      if (Object.prototype.hasOwnProperty.call(open, k)) d.open = open[k];
    });
    return container;
  }

  root.paravt = root.paravt || {};
  root.paravt.renderEpisode = renderEpisode;
  if (typeof module !== "undefined" && module.exports) module.exports = {renderEpisode: renderEpisode};
})(typeof globalThis !== "undefined" ? globalThis : this);
