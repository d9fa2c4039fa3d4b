/*
 * paravt eval report: the page around the episode views. Reads the JSON that paravt.report.html
 * embedded in <script id="paravt-report-data">, draws each run's summary, the runs side by side,
 * and the table of samples (sortable, filterable); a click on a row opens its episode view
 * (episode.js), the same sample of every run side by side. #sample=RUN/ID in the address opens
 * one on load (a link naming no sample says so above the table). No network, no dependencies.
 *
 * Data: {title, generated, notes[], max_thumbs, texts[] (long prompt texts, stored once),
 *        runs[]: {label, bench, model, mode, k, n, metric, score, ci[lo, hi], errors, error_rate,
 *                 parse_problem_rate, mean_tool_calls, tool_usage_rate, latency_p50_s, time_s, ...},
 *        samples[]: {run, id, question, kind, k, truth, prediction, score, correct, crops, calls,
 *                    turns, time, error, note, episode (Episode.to_dict() + truth + thumbnails)}}
 */
(function () {
  "use strict";

  var data = JSON.parse(document.getElementById("paravt-report-data").textContent);
  var runs = data.runs || [];
  var samples = data.samples || [];
  var texts = data.texts || [];
  var multi = runs.length > 1;
  var app = document.getElementById("paravt-report");
  var state = {wrong: false, errors: false, kind: "", k: "", run: "", q: "", sortKey: null, sortDir: 1};
  var open = {}; // sample key -> true: rows whose episode view is open
  var byKey = {};
  samples.forEach(function (s, i) { s._i = i; s._key = s.run + "/" + s.id; byKey[s._key] = s; });

  // ---------------------------------------------------------------------------- helpers

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    if (attrs) Object.keys(attrs).forEach(function (k) {
      var v = attrs[k];
      if (v === undefined || v === null || v === false) return;
      if (k === "text") node.textContent = String(v);
      else if (k.slice(0, 2) === "on") node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, String(v));
    });
    (Array.isArray(children) ? children : children === undefined ? [] : [children]).forEach(function (c) {
      if (c === undefined || c === null || c === false) return;
      node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    });
    return node;
  }

  function num(x) { return typeof x === "number" && isFinite(x); }
  function pct(x) { return num(x) ? x.toFixed(1) + " %" : "-"; }
  function fixed(x, d) { return num(x) ? x.toFixed(d) : "-"; }
  function secs(x) { return num(x) ? (x < 10 ? x.toFixed(2) : x < 100 ? x.toFixed(1) : Math.round(x)) + " s" : ""; }
  function short(s, n) { s = s === null || s === undefined ? "" : String(s); return s.length > n ? s.slice(0, n - 1) + "…" : s; }
  function basename(p) { return String(p || "").split(/[\\/]/).pop(); }

  function resolved(s) {
    // the sample's episode with the long prompt texts put back (they are stored once in texts[])
    if (!s.episode) return null;
    if (s._episode) return s._episode;
    var fix = function (g) {
      if (!g || !Array.isArray(g.prompt)) return g;
      return Object.assign({}, g, {prompt: g.prompt.map(function (m) {
        return typeof m.content === "number" ? Object.assign({}, m, {content: texts[m.content]}) : m;
      })});
    };
    var ep = Object.assign({}, s.episode);
    ep.turns = (ep.turns || []).map(function (t) {
      return Object.assign({}, t, {generation: fix(t.generation), calls: (t.calls || []).map(function (c) {
        return Object.assign({}, c, {generation: fix(c.generation)});
      })});
    });
    s._episode = ep;
    return ep;
  }

  // ---------------------------------------------------------------------------- runs

  function runCard(r, i) {
    var items = [
      ["benchmark", r.bench], ["model", basename(r.model) || r.model, r.model], ["mode", r.mode], ["K", r.k],
      ["n", r.n + (r.pending ? " (" + r.pending + " pending)" : "")],
      ["errors", pct(r.error_rate) + " (" + r.errors + ")"], ["parse problems", pct(r.parse_problem_rate)],
      // asked: the calls the model wrote; run: those executed (at most max_parallel a turn, a readable window)
      ["crops", "asked " + fixed(r.mean_tool_calls, 2) + " · run " + fixed(r.mean_executed_calls, 2) +
        " a sample · tools used in " + pct(r.tool_usage_rate)],
      ["time", secs(r.time_s) + " of samples · p50 " + secs(r.latency_p50_s) + " · p90 " + secs(r.latency_p90_s)],
    ];
    if (r.created) items.push(["run", r.created]);
    var dl = el("dl", {class: "rp-facts"});
    items.forEach(function (it) {
      dl.appendChild(el("dt", {text: it[0]}));
      dl.appendChild(el("dd", {text: it[1] === undefined || it[1] === null ? "-" : String(it[1]), title: it[2] || null}));
    });
    var causes = Object.keys(r.error_causes || {});
    return el("section", {class: "rp-run", "data-run": i}, [
      el("h2", {text: r.label, title: r.path}),
      el("div", {class: "rp-score"}, [el("span", {class: "rp-big", text: fixed(r.score, 1) + " %"}), " " + r.metric,
        el("div", {class: "rp-ci", text: "95 % interval " + fixed(r.ci[0], 1) + "–" + fixed(r.ci[1], 1) + " % (Wilson, n = " + r.n + ")"})]),
      dl,
      causes.length ? el("details", {class: "rp-causes"}, [el("summary", {text: "error causes"}),
        el("ul", null, causes.map(function (c) { return el("li", {text: r.error_causes[c] + " × " + c}); }))]) : null,
    ]);
  }

  function comparison() {
    // the runs side by side: metric rows, run columns; then score breakdowns; then paired outcomes
    var rows = [
      ["score", function (r) { return r.score; }, function (r) { return fixed(r.score, 1) + " [" + fixed(r.ci[0], 1) + ", " + fixed(r.ci[1], 1) + "]"; }, 1],
      ["mode", null, function (r) { return r.mode || "-"; }], ["K", null, function (r) { return r.k === undefined ? "-" : String(r.k); }],
      ["n", null, function (r) { return String(r.n); }],
      ["errors %", function (r) { return r.error_rate; }, function (r) { return fixed(r.error_rate, 1); }, -1],
      ["parse problems %", function (r) { return r.parse_problem_rate; }, function (r) { return fixed(r.parse_problem_rate, 1); }, -1],
      ["crops asked a sample", null, function (r) { return fixed(r.mean_tool_calls, 2); }],
      ["crops run a sample", null, function (r) { return fixed(r.mean_executed_calls, 2); }],
      ["tool use %", null, function (r) { return fixed(r.tool_usage_rate, 1); }],
      ["turns a sample", null, function (r) { return fixed(r.mean_turns, 2); }],
      ["p50 time", function (r) { return r.latency_p50_s; }, function (r) { return secs(r.latency_p50_s); }, -1],
    ];
    var groups = {};
    runs.forEach(function (r) { Object.keys(r.breakdowns || {}).forEach(function (b) { groups[b] = groups[b] || {}; Object.keys(r.breakdowns[b]).forEach(function (g) { groups[b][g] = true; }); }); });
    Object.keys(groups).sort().forEach(function (b) {
      Object.keys(groups[b]).sort().forEach(function (g) {
        var get = function (r) { var v = (r.breakdowns[b] || {})[g]; return num(v) ? v : null; };
        rows.push([b.replace(/_/g, " ") + ": " + g, get, function (r) { var v = get(r); return v === null ? "-" : v.toFixed(1); }, 1]);
      });
    });
    var table = el("table", {class: "rp-compare", id: "rp-compare"}, [
      el("thead", null, el("tr", null, [el("th", {text: ""})].concat(runs.map(function (r) { return el("th", {text: r.label}); })))),
      el("tbody", null, rows.map(function (row) {
        var best = null;
        if (row[1] && row[3]) {
          var vals = runs.map(row[1]).filter(num);
          if (vals.length > 1 && Math.max.apply(null, vals) !== Math.min.apply(null, vals)) best = row[3] > 0 ? Math.max.apply(null, vals) : Math.min.apply(null, vals);
        }
        return el("tr", null, [el("th", {text: row[0]})].concat(runs.map(function (r) {
          return el("td", {class: best !== null && row[1](r) === best ? "rp-best" : null, text: row[2](r)});
        })));
      })),
    ]);
    return el("section", {class: "rp-side"}, [el("h2", {text: "Runs side by side"}), table, paired()]);
  }

  function paired() {
    // for the first run against each other: the samples both got right, only one, neither
    var right = runs.map(function () { return {}; });
    samples.forEach(function (s) { right[s.run][s.id] = s.correct; });
    var rows = [];
    for (var j = 1; j < runs.length; j++) {
      var c = {both: 0, first: 0, other: 0, neither: 0};
      Object.keys(right[0]).forEach(function (id) {
        if (!(id in right[j])) return;
        var a = right[0][id], b = right[j][id];
        c[a && b ? "both" : a ? "first" : b ? "other" : "neither"]++;
      });
      rows.push(el("tr", null, [el("th", {text: runs[0].label + " vs " + runs[j].label}), el("td", {text: c.both}),
        el("td", {text: c.first}), el("td", {text: c.other}), el("td", {text: c.neither})]));
    }
    return el("table", {class: "rp-compare rp-paired"}, [el("thead", null, el("tr", null, [el("th", {text: "same samples"}),
      el("th", {text: "both right"}), el("th", {text: "only the first"}), el("th", {text: "only the other"}), el("th", {text: "both wrong"})])),
      el("tbody", null, rows)]);
  }

  // ---------------------------------------------------------------------------- the samples table

  var COLUMNS = [
    {key: "run", label: "run", num: true, show: multi, cell: function (s) { return runs[s.run].label; }},
    {key: "id", label: "id", cell: function (s) { return s.id; }},
    {key: "kind", label: "kind", cell: function (s) { return s.kind; }},
    {key: "k", label: "K", num: true, cell: function (s) { return s.k === null || s.k === undefined ? "" : String(s.k); }},
    {key: "question", label: "question", cell: function (s) { return short(s.question, 90); }, title: function (s) { return s.question; }},
    {key: "truth", label: "truth", cell: function (s) { return short(s.truth, 40); }, title: function (s) { return s.truth; }},
    {key: "prediction", label: "prediction", cell: function (s) { return s.prediction === null || s.prediction === undefined ? "—" : short(s.prediction, 40); }, title: function (s) { return s.prediction; }},
    {key: "correct", label: "correct", num: true, cell: function (s) { return s.correct ? "✓" : "✗"; }},
    {key: "score", label: "score", num: true, cell: function (s) { return fixed(s.score, 2); }},
    {key: "crops", label: "crops run / asked", num: true, cell: function (s) { return s.crops + " / " + s.calls; }, title: function (s) { return s.crops + " of the " + s.calls + " calls asked were run"; }},
    {key: "turns", label: "turns", num: true, cell: function (s) { return String(s.turns); }},
    {key: "time", label: "time", num: true, cell: function (s) { return secs(s.time); }},
    {key: "error", label: "error", cell: function (s) { return short(s.error || "", 60); }, title: function (s) { return s.error; }},
  ].filter(function (c) { return c.show !== false; });

  function sortValue(s, key) {
    var v = key === "correct" ? (s.correct ? 1 : 0) : s[key];
    return v === undefined ? null : v;
  }

  function visible() {
    var q = state.q.trim().toLowerCase();
    var list = samples.filter(function (s) {
      if (state.wrong && s.correct) return false;
      if (state.errors && !s.error) return false;
      if (state.kind && s.kind !== state.kind) return false;
      if (state.k && String(s.k) !== state.k) return false;
      if (state.run && String(s.run) !== state.run) return false;
      if (q && [s.id, s.question, s.truth, s.prediction, s.error].join("\n").toLowerCase().indexOf(q) < 0) return false;
      return true;
    });
    if (state.sortKey) {
      var key = state.sortKey, dir = state.sortDir;
      list.sort(function (a, b) {
        var x = sortValue(a, key), y = sortValue(b, key);
        if (x === null && y === null) return a._i - b._i;
        if (x === null) return 1;
        if (y === null) return -1;
        var c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y), undefined, {numeric: true});
        return c ? c * dir : a._i - b._i;
      });
    }
    return list;
  }

  function options(values, label) {
    return [el("option", {value: "", text: "all"})].concat(values.map(function (v) { return el("option", {value: v, text: label ? label(v) : v}); }));
  }

  function uniq(get) {
    var seen = {};
    samples.forEach(function (s) { var v = get(s); if (v !== null && v !== undefined && v !== "") seen[String(v)] = true; });
    return Object.keys(seen).sort(function (a, b) { return a.localeCompare(b, undefined, {numeric: true}); });
  }

  var tbody, countEl;

  function filters() {
    var bind = function (id, key, prop) {
      return function (e) { state[key] = e.target[prop]; draw(); };
    };
    var parts = [
      el("label", null, [el("input", {type: "checkbox", id: "f-wrong", onchange: bind("f-wrong", "wrong", "checked")}), " wrong only"]),
      el("label", null, [el("input", {type: "checkbox", id: "f-errors", onchange: bind("f-errors", "errors", "checked")}), " errors only"]),
      el("label", null, ["kind ", el("select", {id: "f-kind", onchange: bind("f-kind", "kind", "value")}, options(uniq(function (s) { return s.kind; })))]),
      el("label", null, ["K ", el("select", {id: "f-k", onchange: bind("f-k", "k", "value")}, options(uniq(function (s) { return s.k; })))]),
    ];
    if (multi) parts.push(el("label", null, ["run ", el("select", {id: "f-run", onchange: bind("f-run", "run", "value")},
      options(runs.map(function (r, i) { return String(i); }), function (i) { return runs[+i].label; }))]));
    parts.push(el("input", {type: "search", id: "f-search", placeholder: "search id, question, answers, errors",
      oninput: bind("f-search", "q", "value")}));
    countEl = el("span", {id: "f-count", class: "rp-count"});
    parts.push(countEl);
    return el("div", {class: "rp-filters"}, parts);
  }

  function header() {
    return el("thead", null, el("tr", null, COLUMNS.map(function (c) {
      var sorted = state.sortKey === c.key;
      return el("th", {class: "rp-col-" + c.key + (c.num ? " rp-num" : ""), "data-sort": c.key, tabindex: 0,
        "aria-sort": sorted ? (state.sortDir > 0 ? "ascending" : "descending") : "none",
        title: "sort by " + c.label, onclick: function () { sortBy(c.key); },
        onkeydown: function (e) { if (e.key === "Enter") sortBy(c.key); }},
        [c.label, el("span", {class: "rp-arrow", text: sorted ? (state.sortDir > 0 ? " ▲" : " ▼") : ""})]);
    })));
  }

  function sortBy(key) {
    if (state.sortKey === key) state.sortDir = -state.sortDir;
    else { state.sortKey = key; state.sortDir = 1; }
    var table = document.getElementById("rp-samples");
    table.replaceChild(header(), table.tHead);
    draw();
  }

  function row(s) {
    return el("tr", {class: "rp-row" + (s.correct ? " rp-right" : " rp-wrong") + (s.error ? " rp-err" : "") + (open[s._key] ? " rp-open" : ""),
      "data-key": s._key, "data-id": s.id, "data-run": s.run, "data-correct": s.correct ? 1 : 0, "data-error": s.error ? 1 : 0,
      tabindex: 0, onclick: function () { toggle(s); }, onkeydown: function (e) { if (e.key === "Enter") toggle(s); }},
      COLUMNS.map(function (c) {
        return el("td", {class: "rp-col-" + c.key + (c.num ? " rp-num" : ""), text: c.cell(s), title: c.title ? c.title(s) : null});
      }));
  }

  function detail(s) {
    // the same sample in every run (the clicked run first), side by side
    var same = [s].concat(samples.filter(function (o) { return o.id === s.id && o.run !== s.run; }));
    var box = el("div", {class: "rp-episodes", style: "grid-template-columns: repeat(" + same.length + ", minmax(0, 1fr))"});
    var tr = el("tr", {class: "rp-detail", "data-key": s._key}, el("td", {colspan: COLUMNS.length}, box));
    return {tr: tr, fill: function () {
      same.forEach(function (o) {
        var slot = el("div", {class: "rp-slot", "data-run": o.run});
        box.appendChild(slot);
        var ep = resolved(o);
        if (!ep) {
          slot.appendChild(el("div", {class: "pv-episode"}, [multi ? el("h3", {class: "pv-label", text: runs[o.run].label}) : null,
            el("div", {class: "pv-error", text: "no episode trace: " + (o.error || "the sample failed before its first turn")})]));
          return;
        }
        window.paravt.renderEpisode(slot, ep, {label: multi ? runs[o.run].label : null, expected: o.truth,
          correct: o.correct, score: o.score, note: o.note});
      });
    }};
  }

  function sampleLink(hash) {
    // #sample=RUN/ID: {key} of a sample of this report, {problem} for a link that names none, {} for no link
    var m = /^#sample=(.*)$/.exec(hash || "");
    if (!m) return {};
    var key;
    try { key = decodeURIComponent(m[1]); } catch (e) {
      return {problem: "The address's #sample= link (" + short(m[1], 80) + ") is not a valid one: no sample opened."};
    }
    if (byKey[key]) return {key: key};
    return {problem: "This report holds no sample " + short(key, 120) + " (the address's #sample= link): no sample opened."};
  }

  function toggle(s) {
    open[s._key] = !open[s._key];
    if (!open[s._key]) delete open[s._key];
    if (history.replaceState) history.replaceState(null, "", open[s._key] ? "#sample=" + encodeURIComponent(s._key) : "#");
    draw();
  }

  function draw() {
    var list = visible();
    while (tbody.firstChild) tbody.removeChild(tbody.firstChild);
    var pending = [];
    list.forEach(function (s) {
      tbody.appendChild(row(s));
      if (open[s._key]) {
        var d = detail(s);
        tbody.appendChild(d.tr);
        pending.push(d.fill);
      }
    });
    pending.forEach(function (f) { f(); }); // in the page first: the views size themselves to it
    countEl.textContent = list.length + " of " + samples.length + " rows";
  }

  // ---------------------------------------------------------------------------- the page

  document.title = data.title || document.title;
  app.appendChild(el("header", {class: "rp-top"}, [el("h1", {text: data.title || "paravt eval report"}),
    el("div", {class: "rp-dim", text: "written " + (data.generated || "") + " by paravt eval report · " + samples.length + " samples"})]));
  if ((data.notes || []).length) app.appendChild(el("ul", {class: "rp-notes"}, data.notes.map(function (n) { return el("li", {text: n}); })));
  app.appendChild(el("div", {class: "rp-runs"}, runs.map(runCard)));
  if (multi) app.appendChild(comparison());
  var table = el("table", {class: "rp-samples", id: "rp-samples"});
  tbody = el("tbody");
  app.appendChild(el("section", {class: "rp-table"}, [el("h2", {text: "Samples"}),
    el("div", {class: "rp-dim", text: "click a row for what the model did; correct: full marks (grounding: IoU ≥ 0.5)"}),
    filters(), el("div", {class: "rp-scroll"}, table)]));
  table.appendChild(header());
  table.appendChild(tbody);
  var link = sampleLink(location.hash);
  if (link.key) open[link.key] = true;
  if (link.problem) table.parentNode.parentNode.insertBefore(
    el("div", {class: "rp-linknote", role: "alert", text: link.problem}), table.parentNode);
  draw();
  if (link.key) {
    var first = tbody.querySelector("tr.rp-detail");
    if (first) first.previousSibling.scrollIntoView({block: "start"});
  }
  document.documentElement.setAttribute("data-ready", "1");
})();
