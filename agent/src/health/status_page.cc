#include "health/status_page.h"

#include <string_view>

#include "output/valid_text.h"

namespace dist::agent {
namespace {

constexpr std::string_view kPlaceholder = "@STATUS_JSON@";

// The page itself. Edit it as HTML; it is served as it stands, with kPlaceholder replaced.
constexpr std::string_view kPage = R"page(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dist-launch status</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 16px 24px; color: #1b1f24; background: #fff; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  h2 { font-size: 15px; margin: 18px 0 6px; }
  code, td.num, .mono { font-family: ui-monospace, Menlo, Consolas, monospace; }
  #summary span { margin-right: 16px; white-space: nowrap; }
  #conn { font-size: 12px; color: #57606a; }
  #conn.lost { color: #b42318; font-weight: 600; }
  .state-running { color: #1a7f37; font-weight: 600; }
  .state-failed, .state-stopping { color: #b42318; font-weight: 600; }
  svg text { font: 11px system-ui, sans-serif; fill: #57606a; }
  svg .grid { stroke: #e4e7eb; stroke-width: 1; }
  svg .axis { stroke: #8c959f; stroke-width: 1; }
  #chart .plotarea { fill: #fbfbf7; }
  #chart .series { fill: none; stroke-width: 2; stroke-linejoin: round; }
  #legend span { margin-right: 14px; white-space: nowrap; font-size: 12px; }
  #legend i { display: inline-block; width: 14px; height: 3px; vertical-align: middle; margin-right: 4px; }
  table { border-collapse: collapse; }
  th, td { padding: 3px 10px; text-align: left; border-bottom: 1px solid #eaeef2; }
  th { font-weight: 600; font-size: 12px; color: #57606a; }
  td.num { text-align: right; }
  .mark { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 11px; font-weight: 600; margin-right: 4px; }
  .mark.hung { background: #fde2e1; color: #b42318; }
  .mark.paused { background: #e8eefc; color: #1f4db8; }
  .mark.straggler { background: #fff1d6; color: #9a6700; }
  .mark.pending { background: #eef2f7; color: #3b4a5a; }
  #timeline .round { stroke: none; }
  #events { list-style: none; padding: 0; margin: 6px 0; font-size: 12px; }
  #events li { padding: 1px 0; }
  #events .when { color: #57606a; margin-right: 8px; font-family: ui-monospace, Menlo, Consolas, monospace; }
  .muted { color: #8c959f; }
  footer { margin-top: 18px; font-size: 12px; color: #57606a; }
</style>
</head>
<body data-polls="0">
<header>
  <h1>dist-launch <span id="run" class="mono"></span></h1>
  <div id="summary"></div>
  <div id="conn">loading</div>
</header>
<section>
  <h2 id="chart-title">Step time per rank</h2>
  <svg id="chart" width="960" height="300" role="img" aria-label="step time per rank"></svg>
  <div id="legend"></div>
</section>
<section>
  <h2>Workers on this node</h2>
  <table id="ranks">
    <thead><tr><th>rank</th><th>local</th><th>steps</th><th>steps/s</th><th>step time</th>
      <th>last progress</th><th>beats</th><th>hang timeout</th><th>marks</th><th>last 2 min</th></tr></thead>
    <tbody></tbody>
  </table>
</section>
<section>
  <h2>Timeline: rounds, restarts, hangs</h2>
  <svg id="timeline" width="960" height="64" role="img" aria-label="timeline"></svg>
  <ul id="events"></ul>
</section>
<footer>This node only, as its agent sees it; <code>dist-launch status --watch</code> shows every
  node. Data: <a href="status.json">status.json</a>, <a href="metrics">metrics</a>.</footer>
<script id="initial" type="application/json">@STATUS_JSON@</script>
<script>
"use strict";
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                 "#17becf", "#bcbd22", "#7f7f7f"];
const COLUMNS = ["t", "round", "step_s", "beat_s"];
const EVENT_STYLE = {
  rendezvous: ["#0969da", "round"], restart: ["#d4a72c", "restart"],
  worker_hung: ["#b42318", "hung"], timer_expired: ["#8250df", "timer"],
  verdict: ["#57606a", "verdict"], node_lost: ["#b42318", "node lost"],
  node_joined: ["#1a7f37", "node joined"], job_end: ["#1b1f24", "end"],
  worker_exit: ["#cf222e", "failed"]
};
const SVG = "http://www.w3.org/2000/svg";
const view = { status: null, history: {}, events: [], since: 0, polls: 0 };
// The token the page was opened with (?token=, --metrics-token-file), for its own requests; none
// when the browser sends it (Basic) or none is asked for.
const TOKEN = new URLSearchParams(location.search).get("token");

const $ = (id) => document.getElementById(id);
const color = (rank) => PALETTE[rank % PALETTE.length];
function esc(text) {
  return String(text).replace(/[&<>"]/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;"}[c]));
}
function seconds(v) {
  if (v === null || v === undefined || !isFinite(v)) return "-";
  v = Math.max(0, v);
  if (v < 10) return v.toFixed(2) + " s";
  if (v < 100) return v.toFixed(1) + " s";
  if (v < 3600) return Math.floor(v / 60) + "m" + String(Math.floor(v % 60)).padStart(2, "0") + "s";
  return Math.floor(v / 3600) + "h" + String(Math.floor(v / 60) % 60).padStart(2, "0") + "m";
}
function clock(t) { return new Date(t * 1000).toLocaleTimeString(); }
function el(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}
function text(parent, x, y, content, anchor) {
  const t = el("text", {x: x, y: y, "text-anchor": anchor || "start"}, parent);
  t.textContent = content;
  return t;
}

// Appends an answer of /status.json: new samples and events after the last answer's time.
function merge(s) {
  view.status = s;
  for (const [rank, cols] of Object.entries(s.history.ranks)) {
    const mine = view.history[rank] || (view.history[rank] = {t: [], round: [], step_s: [], beat_s: []});
    for (const k of COLUMNS) mine[k].push(...cols[k]);
  }
  const cut = s.time - s.history.window_s;
  for (const cols of Object.values(view.history)) {
    let old = 0;
    while (old < cols.t.length && cols.t[old] < cut) ++old;
    if (old) for (const k of COLUMNS) cols[k].splice(0, old);
  }
  view.events.push(...s.events);
  if (view.events.length > 512) view.events.splice(0, view.events.length - 512);
  view.since = s.time;
}

// A rank's plotted values: its step times, or its heartbeat intervals when it reports no steps.
function series(cols) {
  const steps = cols.step_s.some((v) => v !== null);
  return {values: steps ? cols.step_s : cols.beat_s, steps: steps};
}

function renderSummary(s) {
  $("run").textContent = s.run_id;
  const hung = s.ranks.filter((r) => r.hung).length;
  const stragglers = s.ranks.filter((r) => r.straggler).length;
  const items = [
    ["host", esc(s.host)], ["node", s.num_nodes ? s.node_rank + " of " + s.num_nodes : "-"],
    ["state", "<span class=\"state-" + esc(s.state) + "\">" + esc(s.state) + "</span>"],
    ["round", s.round], ["restarts", s.restarts + " of " + s.max_restarts],
    ["world size", s.world_size], ["workers here", s.workers_alive + " of " + s.nproc_per_node],
    ["stragglers", stragglers], ["suspected hangs", hung], ["up", seconds(s.time - s.started)]];
  $("summary").innerHTML = items.map(([k, v]) => "<span>" + k + ": <b>" + v + "</b></span>").join(" ");
}

function renderChart(s) {
  const svg = $("chart");
  svg.replaceChildren();
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const L = 64, R = 14, T = 10, B = 26, w = W - L - R, h = H - T - B;
  el("rect", {class: "plotarea", x: L, y: T, width: w, height: h}, svg);
  const ranks = Object.keys(view.history).map(Number).sort((a, b) => a - b);
  let first = s.time, all = [], anySteps = false;
  for (const rank of ranks) {
    const cols = view.history[rank], ser = series(cols);
    anySteps = anySteps || ser.steps;
    if (cols.t.length) first = Math.min(first, cols.t[0]);
    for (const v of ser.values) if (v !== null) all.push(v);
  }
  $("chart-title").textContent = anySteps || !all.length ? "Step time per rank"
                                                          : "Step time per rank (from heartbeats)";
  const span = Math.max(60, s.time - first), x0 = s.time - span;
  all.sort((a, b) => a - b);
  const top = all.length ? all[Math.min(all.length - 1, Math.floor(all.length * 0.98))] * 1.25 : 1;
  const x = (t) => L + (t - x0) / span * w, y = (v) => T + h - Math.min(v, top) / top * h;
  for (let i = 0; i <= 4; ++i) {
    const v = top * i / 4, yy = y(v);
    el("line", {class: "grid", x1: L, x2: L + w, y1: yy, y2: yy}, svg);
    text(svg, L - 6, yy + 4, seconds(v), "end");
  }
  const step = span > 300 ? 120 : span > 120 ? 60 : 15;
  for (let ago = 0; ago <= span; ago += step) {
    const xx = x(s.time - ago);
    el("line", {class: "axis", x1: xx, x2: xx, y1: T + h, y2: T + h + 4}, svg);
    const label = ago < 60 ? ago + " s" : ago % 60 ? Math.floor(ago / 60) + "m" + String(ago % 60).padStart(2, "0") + "s" : ago / 60 + " min";
    text(svg, xx, H - 8, ago ? "-" + label : "now", "middle");
  }
  el("line", {class: "axis", x1: L, x2: L + w, y1: T + h, y2: T + h}, svg);
  el("line", {class: "axis", x1: L, x2: L, y1: T, y2: T + h}, svg);
  if (!all.length) {
    text(svg, L + w / 2, T + h / 2, "no step times yet: workers report steps (or heartbeats) once they run", "middle");
  }
  const legend = [];
  for (const rank of ranks) {
    const cols = view.history[rank], ser = series(cols);
    let d = "", last = null, prevT = null, prevRound = null;
    for (let i = 0; i < cols.t.length; ++i) {
      const v = ser.values[i];
      if (v === null) continue;
      const fresh = prevT === null || cols.round[i] !== prevRound || cols.t[i] - prevT > 10 * s.history.interval_s + Math.max(v, 0);
      d += (fresh ? "M" : "L") + x(cols.t[i]).toFixed(1) + "," + y(v).toFixed(1);
      prevT = cols.t[i]; prevRound = cols.round[i]; last = [cols.t[i], v];
    }
    if (d) el("path", {class: "series", "data-rank": rank, d: d, stroke: color(rank)}, svg);
    if (last) el("circle", {cx: x(last[0]), cy: y(last[1]), r: 3.5, fill: color(rank)}, svg);
    legend.push("<span data-rank=\"" + rank + "\"><i style=\"background:" + color(rank) + "\"></i>rank " +
                rank + (ser.steps ? "" : " (heartbeat interval)") + "</span>");
  }
  $("legend").innerHTML = legend.join("");
}

function sparkline(rank) {
  const cols = view.history[rank];
  if (!cols) return "";
  const ser = series(cols), end = view.status.time, pts = [];
  let top = 0;
  for (let i = 0; i < cols.t.length; ++i) {
    if (ser.values[i] !== null && cols.t[i] > end - 120) { pts.push([cols.t[i], ser.values[i]]); top = Math.max(top, ser.values[i]); }
  }
  if (!pts.length) return "<span class=\"muted\">-</span>";
  const span = Math.max(10, end - pts[0][0]);  // the last two minutes, or what there is of them
  const p = pts.map(([t, v]) => (100 - (end - t) / span * 98).toFixed(1) + "," + (18 - v / top * 16).toFixed(1));
  return "<svg width=\"100\" height=\"20\"><polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" +
         color(rank) + "\" points=\"" + p.join(" ") + "\"/></svg>";
}

function renderRanks(s) {
  const rows = s.ranks.map((r) => {
    const marks = (r.hung ? "<span class=\"mark hung\" title=\"" + esc(r.doing) + "\">HUNG?</span>" : "") +
                  (r.paused ? "<span class=\"mark paused\" title=\"" + esc(r.doing) + "\">PAUSED</span>" : "") +
                  (r.straggler ? "<span class=\"mark straggler\">STRAGGLER</span>" : "") +
                  (r.pending_collective ? "<span class=\"mark pending\">waits in " + esc(r.pending_collective) + "</span>" : "");
    const cells = [r.rank, r.local_rank, r.steps === null ? "-" : r.steps,
                   r.steps_per_second === null ? "-" : r.steps_per_second.toFixed(2),
                   seconds(r.step_seconds),
                   r.progress_age_seconds === null ? "-" : seconds(r.progress_age_seconds) + " ago",
                   r.beats, seconds(r.hang_timeout_seconds)];
    return "<tr data-rank=\"" + r.rank + "\"><td><i style=\"color:" + color(r.rank) + "\">&#9632;</i> " +
           cells.map((c, i) => (i ? "<td class=\"num\">" : "") + esc(c) + "</td>").join("") +
           "<td>" + marks + "</td><td>" + sparkline(r.rank) + "</td></tr>";
  });
  $("ranks").tBodies[0].innerHTML = rows.length ? rows.join("")
      : "<tr><td colspan=\"10\" class=\"muted\">no worker running on this node now</td></tr>";
}

function describe(e) {
  switch (e.event) {
    case "rendezvous": return "round " + e.round + ": node " + e.node_rank + " of " + e.num_nodes + ", world size " + e.world_size;
    case "restart": return "restart " + e.restart_count + " of " + e.max_restarts;
    case "worker_hung": return "rank " + e.rank + " hung (silent " + seconds(e.silent_ms / 1000) + ")";
    case "hang": return "hang: " + e.verdict;
    case "hang_suspected": return "no progress for " + seconds(e.silent_ms / 1000) + ": " + e.verdict;
    case "hang_cleared": return (e.ended ? "over (every rank stepped or exited 0) after " : "progress again after ") + seconds(e.silent_ms / 1000);
    case "worker_exit": return "rank " + e.rank + " exited " + (e.signal || e.exit_code) + (e.failed ? " (failed)" : "") + (e.reason ? ": " + e.reason : "");
    case "worker_start": return "rank " + e.rank + " started (pid " + e.pid + ")";
    case "verdict": return "verdict: " + e.action + " (" + e.reason + ")";
    case "timer_expired": return "rank " + e.rank + ": timer " + e.scope_id + " expired";
    case "node_lost": return "node " + e.node_rank + " lost";
    case "job_end": return "job " + e.outcome + " (exit " + e.exit_code + ")";
    case "job_start": return e.entrypoint + ": " + e.nnodes + " node(s), " + e.nproc_per_node + " per node, max " + e.max_restarts + " restart(s)";
    case "node_joined": return "a node asked to join round " + e.round;
    default: return e.event;
  }
}

function renderTimeline(s) {
  const svg = $("timeline");
  svg.replaceChildren();
  const W = +svg.getAttribute("width"), L = 64, R = 14, w = W - L - R;
  const start = Math.min(s.started, ...view.events.map((e) => e.t)), span = Math.max(1, s.time - start);
  const x = (t) => L + (t - start) / span * w;
  text(svg, L - 6, 24, "rounds", "end");
  const rounds = view.events.filter((e) => e.event === "rendezvous");
  rounds.forEach((e, i) => {
    const end = i + 1 < rounds.length ? rounds[i + 1].t : s.time;
    const r = el("rect", {class: "round", x: x(e.t), y: 14, height: 16, width: Math.max(1, x(end) - x(e.t)),
                          fill: e.round % 2 ? "#9ecbff" : "#54aeff"}, svg);
    el("title", {}, r).textContent = describe(e);
    if (x(end) - x(e.t) > 24) text(svg, x(e.t) + 4, 26, "r" + e.round);
  });
  for (const e of view.events) {
    const style = EVENT_STYLE[e.event];
    if (!style || e.event === "rendezvous" || (e.event === "worker_exit" && !e.failed)) continue;
    const m = el("path", {d: "M" + x(e.t) + ",34 l5,9 l-10,0 z", fill: style[0], "data-event": e.event}, svg);
    el("title", {}, m).textContent = clock(e.t) + " " + describe(e);
  }
  el("line", {class: "axis", x1: L, x2: L + w, y1: 46, y2: 46}, svg);
  text(svg, L, 60, clock(start));
  text(svg, L + w, 60, clock(s.time), "end");
  const shown = view.events.filter((e) => e.event !== "worker_start").slice(-15).reverse();
  $("events").innerHTML = shown.map((e) => {
    const style = EVENT_STYLE[e.event] || ["#57606a"];
    return "<li data-event=\"" + esc(e.event) + "\"><span class=\"when\">" + clock(e.t) + "</span><b style=\"color:" +
           style[0] + "\">" + esc(e.event) + "</b> " + esc(describe(e)) + "</li>";
  }).join("");
}

function render() {
  const s = view.status;
  if (!s) return;
  renderSummary(s);
  renderChart(s);
  renderRanks(s);
  renderTimeline(s);
  document.body.dataset.polls = view.polls;
  document.title = "dist-launch " + s.run_id + ": " + s.state;
}

async function poll() {
  try {
    const answer = await fetch("status.json?since=" + view.since,
                               {cache: "no-store", headers: TOKEN ? {Authorization: "Bearer " + TOKEN} : {}});
    if (!answer.ok) throw new Error("HTTP " + answer.status);
    merge(await answer.json());
    ++view.polls;
    $("conn").className = "";
    $("conn").textContent = "updated " + clock(view.status.time) + ", every second";
  } catch (err) {
    $("conn").className = "lost";
    $("conn").textContent = "no answer from the agent (" + err.message + "): the job may have ended; last update " +
                            (view.status ? clock(view.status.time) : "never");
  }
  render();
  setTimeout(poll, 1000);
}

if (TOKEN) {
  for (const a of document.querySelectorAll("footer a")) a.search = "?token=" + encodeURIComponent(TOKEN);
}
merge(JSON.parse($("initial").textContent));
render();
setTimeout(poll, 1000);
</script>
</body>
</html>
)page";

}  // namespace

std::string status_page(const nlohmann::ordered_json& initial) {
  // Inside <script>, "<" only ever appears in JSON strings, where \u003c means the same and can
  // end no element.
  std::string json;
  for (const char c : json_text(initial)) {
    if (c == '<') {
      json += "\\u003c";
    } else {
      json.push_back(c);
    }
  }
  std::string page(kPage);
  const auto at = page.find(kPlaceholder);
  if (at != std::string::npos) page.replace(at, kPlaceholder.size(), json);
  return page;
}

}  // namespace dist::agent
