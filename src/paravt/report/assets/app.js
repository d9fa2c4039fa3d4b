/*
 * paravt app: the page `paravt app` serves (src/paravt/app/__init__.py describes the HTTP interface).
 *
 * It uploads or picks a video, POSTs the question to /api/ask and reads the answer, a stream of
 * Server-Sent Events, with fetch (not EventSource, which cannot send the API key as a header).
 * Each event of the episode updates one episode dict the way the server's own Episode grows, and
 * the report's episode view (episode.js, paravt.renderEpisode) redraws it: crop windows appear
 * when the main agent dispatches them (dashed, where it asked), fill in with the window the
 * sub-agent really watched and its summary when that sub-agent finishes, and the answer comes
 * last. The final `episode` event replaces the dict with the server's whole trace (timings,
 * prompts, token counts), so what stays on the page is exactly what the server recorded.
 *
 * Hooks for tests: body[data-state] idle | uploading | running | done | error | stopped;
 * body[data-episode] the episode id; #events li[data-event] one per event received.
 */
(function () {
  "use strict";

  var $ = function (id) { return document.getElementById(id); };
  var KEY_STORE = "paravt-app-key";
  var info = null;              // GET /api/info
  var uploaded = new WeakMap();  // File -> {id, name, duration}: a file is uploaded once
  var controller = null;        // the running ask's AbortController
  var ep = null;                // the episode as drawn
  var thumbnails = [];          // overview thumbnails, kept across the final replacement
  var finished = false;
  var pending = {turn: -1, total: 0, done: 0};

  // ------------------------------------------------------------------------------ small helpers

  function setState(s) { document.body.setAttribute("data-state", s); }

  function status(text, busy) {
    var s = $("status");
    s.textContent = text || "";
    s.classList.toggle("ap-busy", !!busy);
  }

  function showError(text) {
    var e = $("error");
    e.textContent = text || "";
    e.hidden = !text;
  }

  function mb(bytes) { return (bytes / 1048576).toFixed(bytes < 10485760 ? 1 : 0) + " MB"; }

  function secs(t) { return typeof t === "number" && isFinite(t) ? t.toFixed(1) + " s" : "?"; }

  function headers(extra) {
    var h = extra || {};
    var key = $("key").value.trim();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  function errorOf(status, text) {
    // the app's {"error": message}, else the status and the text as it came
    var msg = text;
    try { msg = JSON.parse(text).error || text; } catch (e) { /* not JSON */ }
    var err = new Error(msg || ("HTTP " + status));
    err.status = status;
    return err;
  }

  function api(path, opts) {
    opts = opts || {};
    opts.headers = headers(opts.headers);
    return fetch(path, opts).then(function (r) {
      if (r.ok) return r;
      return r.text().then(function (t) { throw errorOf(r.status, t); });
    });
  }

  // ------------------------------------------------------------------------------ the API key

  function takeKeyFromAddress() {
    // ?key=K or #key=K fills the key field once, then leaves the address bar (and its history)
    var q = new URLSearchParams(location.search), h = new URLSearchParams(location.hash.slice(1));
    var key = q.get("key") || h.get("key");
    if (key !== null) {
      q.delete("key"); h.delete("key");
      var rest = (q.toString() ? "?" + q : "") + (h.toString() ? "#" + h : "");
      history.replaceState(null, "", location.pathname + rest);
      sessionStorage.setItem(KEY_STORE, key);
    }
    $("key").value = sessionStorage.getItem(KEY_STORE) || "";
  }

  // ------------------------------------------------------------------------------ the form

  function fillSelect(sel, values, chosen) {
    while (sel.firstChild) sel.removeChild(sel.firstChild);
    values.forEach(function (v) {
      var o = document.createElement("option");
      o.value = v; o.textContent = v;
      if (v === chosen) o.selected = true;
      sel.appendChild(o);
    });
  }

  var infoError = "";   // the line loadInfo showed, the only one it may take away again
  var infoKey = null;   // the key the form was last filled with

  function infoFailed(text) { infoError = text; showError(text); }

  function loadInfo() {
    infoKey = $("key").value.trim();
    return api("/api/info").then(function (r) { return r.json(); }).then(function (got) {
      info = got;
      // an episode's error shown meanwhile stays: only the key's line goes
      if (infoError && $("error").textContent === infoError) showError("");
      infoError = "";
      fillSelect($("mode"), info.modes, $("mode").value || "parallel");
      fillSelect($("qtype"), info.question_types, $("qtype").value || "auto");
      if (!$("frames").dataset.touched) $("frames").value = info.frames;
      $("model").placeholder = "default: " + (info.model_label || info.model || "the shipped model");
      $("model").title = "a local checkpoint directory, or the http(s) URL of an OpenAI-compatible server; empty: " +
        (info.model || "the app's default model");
      var note = "uploads up to " + mb(info.max_upload_bytes) + ".";
      if (!info.media_root) {
        $("src-media").disabled = true;
        note += " Start the app with --media-root DIR to pick videos already on the server.";
        $("video-note").textContent = note;
        return;
      }
      $("video-note").textContent = note;
      return api("/api/media").then(function (r) { return r.json(); }).then(function (m) {
        fillSelect($("media"), m.files, null);
        $("src-media").disabled = !m.files.length;
        $("media").disabled = !m.files.length;
        if (!m.files.length) $("video-note").textContent = note + " No video files under the media root.";
        else if (m.truncated) $("video-note").textContent = note + " (the first " + m.files.length + " files of the media root)";
      });
    }).catch(function (e) {
      if (e.status === 401) {
        infoFailed("This app needs its API key: enter it in the key field (or open the page as /#key=KEY).");
        $("key").focus();
      } else infoFailed("Cannot reach the app: " + e.message);
    });
  }

  function chosenVideo() {
    // a promise of {upload: id} or {media: path}, uploading the file first when needed
    if ($("src-media").checked) {
      if (!$("media").value) return Promise.reject(new Error("choose a video from the media root"));
      return Promise.resolve({media: $("media").value});
    }
    var file = $("file").files[0];
    if (!file) return Promise.reject(new Error("choose a video file to upload"));
    if (uploaded.has(file)) return Promise.resolve({upload: uploaded.get(file).id});
    if (info && file.size > info.max_upload_bytes) {
      return Promise.reject(new Error(file.name + " is " + mb(file.size) + ", over this app's upload limit of " +
        mb(info.max_upload_bytes) + " (paravt app --max-upload-mb)"));
    }
    return upload(file).then(function (u) { uploaded.set(file, u); return {upload: u.id}; });
  }

  function upload(file) {
    // XMLHttpRequest, not fetch: it reports the upload's progress
    setState("uploading");
    return new Promise(function (resolve, reject) {
      var x = new XMLHttpRequest();
      x.open("PUT", "/api/upload?name=" + encodeURIComponent(file.name));
      var h = headers({"Content-Type": "application/octet-stream"});
      Object.keys(h).forEach(function (k) { x.setRequestHeader(k, h[k]); });
      x.upload.onprogress = function (e) {
        if (e.lengthComputable) status("uploading " + file.name + ": " + Math.round(100 * e.loaded / e.total) + " % of " + mb(e.total), true);
      };
      x.onload = function () {
        if (x.status === 200) {
          var u = JSON.parse(x.responseText);
          status("uploaded " + u.name + " (" + secs(u.duration) + ")");
          resolve(u);
        } else reject(errorOf(x.status, x.responseText));
      };
      x.onerror = function () { reject(new Error("the upload failed (connection closed; the file may be over the upload limit)")); };
      x.send(file);
    });
  }

  // ------------------------------------------------------------------------------ the episode

  function draw() {
    var box = $("episode");
    box.hidden = false;
    var shown = Object.assign({}, ep, {thumbnails: thumbnails});
    paravt.renderEpisode(box, shown, {live: !finished});
  }

  function turnOf(i) {
    var t = ep.turns[i];
    if (!t) { t = ep.turns[i] = {index: i, calls: []}; }
    return t;
  }

  function callOf(turn, index) {
    for (var j = 0; j < turn.calls.length; j++) if (turn.calls[j].index === index) return turn.calls[j];
    var c = {index: index, call: {arguments: null}};
    turn.calls.push(c);
    return c;
  }

  function logEvent(name, d) {
    var brief = "";
    if (name === "overview") brief = d.times.length + " frames over " + secs(d.duration);
    else if (name === "turn_started") brief = "turn " + (d.turn + 1) + (d.forced_answer ? " (answer now)" : "");
    else if (name === "generated") brief = "turn " + (d.turn + 1) + ": " + (d.calls || []).length + " call(s)" +
      (d.answer !== null && d.answer !== undefined ? ", answer " + JSON.stringify(d.answer) : "");
    else if (name === "calls_dispatched") brief = d.calls.map(function (c) {
      var a = c.arguments || {};
      return c.status + " " + a.start_time + "-" + a.end_time;
    }).join(", ");
    else if (name === "subcall_finished") brief = "call " + (d.turn + 1) + "." + (d.index + 1) + " " + d.status +
      (d.start !== null ? " " + d.start + "-" + d.end + " s" : "") + (d.response ? ": " + String(d.response).slice(0, 120) : "");
    else if (name === "answer") brief = JSON.stringify(d.answer) + " after " + secs(d.wall_time);
    else if (name === "thumbnails") brief = d.thumbnails.length + " pictures" + (d.error ? " (" + d.error + ")" : "");
    else if (name === "error") brief = d.message;
    else if (name === "model_ready") brief = d.cached ? d.model + " (already loaded)" : d.model + " loaded in " + secs(d.seconds);
    else if (name === "loading_model") brief = d.model;
    else if (name === "episode") brief = "the whole trace (" + d.turns.length + " turns)";
    var li = document.createElement("li");
    li.setAttribute("data-event", name);
    li.textContent = (typeof d.t === "number" ? d.t.toFixed(2) + " s  " : "") + name + (brief ? "  " + brief : "");
    $("events").appendChild(li);
  }

  function onEvent(name, d) {
    logEvent(name, d);
    if (name === "start") {
      ep = {video: d.video, question: d.question, question_type: d.question_type, config: d.config, turns: []};
      document.body.setAttribute("data-episode", d.id);
      status("episode " + d.id + " started", true);
    } else if (name === "loading_model") {
      status(d.cached ? "model ready" : "loading the model " + d.model + "...", true);
    } else if (name === "model_ready") {
      status("reading the video's overview frames...", true);
    } else if (name === "overview") {
      ep.duration = d.duration;
      ep.overview_times = d.times;
    } else if (name === "thumbnails") {
      thumbnails = d.thumbnails || [];
    } else if (name === "turn_started") {
      var t = turnOf(d.turn);
      t.forced_answer = d.forced_answer;
      status("turn " + (d.turn + 1) + ": the main agent is generating" + (d.forced_answer ? " (told to answer now)" : "") + "...", true);
    } else if (name === "generated") {
      var g = turnOf(d.turn);
      g.generation = {text: d.text, finish_reason: d.finish_reason};
      g.parsed = {think: d.think, answer: d.answer, problems: d.problems || []};
    } else if (name === "calls_dispatched") {
      var tc = turnOf(d.turn);
      tc.calls = d.calls.map(function (c) {
        return {index: c.index, call: {arguments: c.arguments}, status: c.status === "run" ? "running" : c.status, error: c.error};
      });
      var run = d.calls.filter(function (c) { return c.status === "run"; }).length;
      pending = {turn: d.turn, total: run, done: 0};
      status("turn " + (d.turn + 1) + ": " + run + " sub-agent" + (run === 1 ? "" : "s") + " watching their windows at once (0 of " + run + " done)...", true);
    } else if (name === "subcall_finished") {
      var c = callOf(turnOf(d.turn), d.index);
      c.start = d.start; c.end = d.end; c.status = d.status; c.error = d.error; c.response = d.response;
      if (d.ran && d.turn === pending.turn) {
        pending.done += 1;
        status("turn " + (d.turn + 1) + ": " + pending.total + " sub-agent" + (pending.total === 1 ? "" : "s") + " watching their windows at once (" +
          pending.done + " of " + pending.total + " done)...", pending.done < pending.total);
      }
    } else if (name === "tool_response") {
      turnOf(d.turn).tool_response = d.text;
    } else if (name === "answer") {
      ep.answer = d.answer; ep.wall_time = d.wall_time; ep.error = d.error;
      status("answered in " + secs(d.wall_time), true);
    } else if (name === "episode") {
      ep = d;
      finished = true;
    } else if (name === "error") {
      showError(d.message);
      if (ep) ep.error = d.message;
      finished = true;
    } else if (name === "done") {
      finished = true;
    }
    if (ep && name !== "done" && name !== "loading_model" && name !== "model_ready") draw();
  }

  function readEvents(response) {
    // text/event-stream: blocks separated by a blank line, "event: NAME" and "data: JSON" lines
    var reader = response.body.getReader(), decoder = new TextDecoder(), buffer = "", last = null;
    function block(text) {
      var name = "message", data = [];
      text.split("\n").forEach(function (line) {
        if (line.indexOf("event:") === 0) name = line.slice(6).trim();
        else if (line.indexOf("data:") === 0) data.push(line.slice(5).replace(/^ /, ""));
      });
      if (!data.length) return;
      last = name;
      onEvent(name, JSON.parse(data.join("\n")));
    }
    function pump() {
      return reader.read().then(function (r) {
        if (r.done) {
          if (buffer.trim()) block(buffer);
          return last;
        }
        buffer += decoder.decode(r.value, {stream: true}).replace(/\r\n/g, "\n");
        var cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          block(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
        }
        return pump();
      });
    }
    return pump();
  }

  function traceLink() {
    // the server's final trace, to keep: paravt's Episode.from_dict reads it back
    var a = document.createElement("a");
    a.className = "ap-trace";
    a.textContent = "trace JSON";
    a.download = "episode_" + ep.id + ".json";
    a.href = URL.createObjectURL(new Blob([JSON.stringify(ep, null, 1)], {type: "application/json"}));
    return a;
  }

  function ask(event) {
    event.preventDefault();
    showError("");
    var question = $("question").value;
    if (!question.trim()) { showError("Write a question first."); return; }
    $("ask").disabled = true;
    $("stop").disabled = false;
    $("events").textContent = "";
    ep = null; thumbnails = []; finished = false;
    document.body.removeAttribute("data-episode");
    controller = new AbortController();
    var signal = controller.signal;
    chosenVideo().then(function (video) {
      setState("running");
      status("starting...", true);
      var body = {video: video, question: question, frames: parseInt($("frames").value, 10), mode: $("mode").value,
        question_type: $("qtype").value, model: $("model").value.trim() || null};
      return api("/api/ask", {method: "POST", body: JSON.stringify(body), signal: signal,
        headers: {"Content-Type": "application/json"}});
    }).then(readEvents).then(function (last) {
      if (ep && ep.id && last === "done" && !$("error").textContent) {
        status("done: episode " + ep.id + " answered " + JSON.stringify(ep.answer) + " in " + secs(ep.wall_time));
        $("status").appendChild(traceLink());
        setState("done");
      } else if (last !== "done") {
        throw new Error("the connection to the app closed before the episode finished");
      } else {
        status("");
        setState("error");
      }
    }).catch(function (e) {
      if (signal.aborted) {
        status("stopped (the episode was cancelled on the server)");
        setState("stopped");
      } else {
        showError(e.message);
        status("");
        setState("error");
        if (e.status === 401) $("key").focus();
      }
      if (ep) { finished = true; draw(); }
    }).then(function () {
      $("ask").disabled = false;
      $("stop").disabled = true;
      controller = null;
    });
  }

  function init() {
    takeKeyFromAddress();
    $("ask-form").addEventListener("submit", ask);
    $("stop").addEventListener("click", function () { if (controller) controller.abort(); });
    $("key").addEventListener("change", function () {
      sessionStorage.setItem(KEY_STORE, $("key").value.trim());
      // the form blurs the field on every ask: reload only for a new key
      if ($("key").value.trim() !== infoKey || infoError) loadInfo();
    });
    $("frames").addEventListener("input", function () { $("frames").dataset.touched = "1"; });
    $("file").addEventListener("change", function () { $("src-upload").checked = true; });
    $("media").addEventListener("change", function () { $("src-media").checked = true; });
    var resized = null;
    window.addEventListener("resize", function () {
      clearTimeout(resized);
      resized = setTimeout(function () { if (ep) draw(); }, 150);
    });
    loadInfo();
  }

  init();
})();
