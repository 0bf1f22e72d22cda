// agentgym dashboard: runs table, live curves, two runs compared, trajectory viewer.
// Everything shown comes from the JSON API under api/runs (see agentgym/serve/_dashboard.py).
// Trajectories are model output: text goes into the page through text nodes and attributes
// only (never parsed as HTML), and the page's CSP forbids inline scripts.
"use strict";

const POLL_MS = 2000;
const RUNS_POLL_MS = 5000;
const PAGE_SIZE = 50;
const STATUSES = ["ok", "truncated", "error", "infra_error", "late"];
const PANELS = [
  { title: "Reward", keys: ["reward/mean", "eval/reward"] },
  { title: "Reward functions", keys: ["reward/*/mean"] },
  { title: "KL", keys: ["loss/kl"] },
  { title: "Entropy", keys: ["loss/entropy"] },
  { title: "Completion length (tokens)", keys: ["rollout/completion_length"] },
  { title: "Tool calls per episode", keys: ["rollout/tool_calls_per_episode"] },
  { title: "Tool error rate", keys: ["rollout/tool_error_rate"] },
];
const COLORS = ["#2f6fde", "#d9480f", "#17803d", "#9c36b5", "#c2255c", "#0c8599", "#5c940d"];
const SVG_NS = "http://www.w3.org/2000/svg";

// ---- small helpers -------------------------------------------------------------------------

let timers = [];

// Run fn every ms while node is in the page (a view left behind stops its own polling).
function every(ms, node, fn) {
  const timer = setInterval(() => (node.isConnected ? fn() : clearInterval(timer)), ms);
  timers.push(timer);
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== false && value != null) node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child != null) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs = {}, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (text != null) node.textContent = String(text);
  return node;
}

function showError(message) {
  const box = document.getElementById("error");
  box.textContent = message;
  box.hidden = !message;
}

async function getJSON(url) {
  const response = await fetch(url, { headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    throw new Error(`${response.status} ${url}: ${detail}`);
  }
  return body;
}

function fmt(value) {
  if (value == null) return "–";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(3);
  return String(value);
}

function runLink(id) {
  return `#/run/${encodeURIComponent(id)}`;
}

function apiRun(id) {
  return `api/runs/${encodeURIComponent(id)}`;
}

function statusCell(status) {
  return el("td", { class: `status status-${status}` }, status);
}

function pretty(value) {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 1);
    } catch {
      return value;
    }
  }
  return JSON.stringify(value, null, 1);
}

// ---- charts --------------------------------------------------------------------------------

const W = 360, H = 190, PAD = { l: 46, r: 8, t: 8, b: 22 };
// Most points drawn per line: a long run has 100,000s of steps for a panel ~300 px wide.
const MAX_DRAWN = 2000;

// [min, max] of numbers, by a loop: Math.min(...values) overflowed the call stack at ~125,000
// values and the whole run page showed only that error.
function extent(values) {
  let [low, high] = [Infinity, -Infinity];
  for (const v of values) {
    if (v < low) low = v;
    if (v > high) high = v;
  }
  return [low, high];
}

// At most about MAX_DRAWN of points, in order: per bucket of consecutive points its lowest and
// highest, plus the first and last point, so that spikes and both ends still show.
function thin(points) {
  if (points.length <= MAX_DRAWN) return points;
  const size = Math.ceil(points.length / (MAX_DRAWN / 2));
  const kept = [points[0]];
  for (let start = 0; start < points.length; start += size) {
    const end = Math.min(start + size, points.length);
    let [low, high] = [start, start];
    for (let i = start + 1; i < end; i++) {
      if (points[i][1] < points[low][1]) low = i;
      if (points[i][1] > points[high][1]) high = i;
    }
    for (const i of new Set([Math.min(low, high), Math.max(low, high)])) {
      if (i > 0 && i < points.length - 1) kept.push(points[i]);
    }
  }
  kept.push(points[points.length - 1]);
  return kept;
}

// One SVG line chart; series: [{label, color, dash, points: [[x, y], ...]}].
function chart(title, series) {
  const panel = el("div", { class: "panel", "data-title": title }, el("h3", {}, title));
  const drawn = series.filter((s) => s.points.length > 0);
  if (drawn.length === 0) {
    panel.append(el("div", { class: "empty" }, "no data yet"));
    return panel;
  }
  let [x0, x1] = extent(drawn.flatMap((s) => s.points.map((p) => p[0])));
  let [y0, y1] = extent(drawn.flatMap((s) => s.points.map((p) => p[1])));
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  if (y0 === y1) [y0, y1] = [y0 - 0.5, y1 + 0.5];
  const sx = (x) => PAD.l + ((x - x0) / (x1 - x0)) * (W - PAD.l - PAD.r);
  const sy = (y) => H - PAD.b - ((y - y0) / (y1 - y0)) * (H - PAD.t - PAD.b);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img" });
  root.append(
    svg("line", { class: "axis", x1: PAD.l, y1: H - PAD.b, x2: W - PAD.r, y2: H - PAD.b }),
    svg("line", { class: "axis", x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: H - PAD.b }),
    svg("text", { class: "tick", x: PAD.l - 4, y: PAD.t + 8, "text-anchor": "end" }, fmt(y1)),
    svg("text", { class: "tick", x: PAD.l - 4, y: H - PAD.b, "text-anchor": "end" }, fmt(y0)),
    svg("text", { class: "tick", x: PAD.l, y: H - 6 }, `step ${fmt(x0)}`),
    svg("text", { class: "tick", x: W - PAD.r, y: H - 6, "text-anchor": "end" }, fmt(x1)),
  );
  const legend = el("div", { class: "legend" });
  for (const s of drawn) {
    const points = thin(s.points).map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`);
    const line = svg("polyline", {
      points: points.join(" "), fill: "none", stroke: s.color, "stroke-width": 1.6,
      "data-series": s.label, "data-points": s.points.length,
    });
    if (s.dash) line.setAttribute("stroke-dasharray", "5 3");
    root.append(line);
    if (s.points.length <= 60) {
      for (const [x, y] of s.points) {
        const dot = svg("circle", { cx: sx(x), cy: sy(y), r: 2, fill: s.color });
        dot.append(svg("title", {}, `${s.label}  step ${x}: ${fmt(y)}`));
        root.append(dot);
      }
    }
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = s.color; // CSSOM, not a style attribute: the CSP forbids those
    legend.append(el("span", {}, swatch, s.label));
  }
  panel.append(root, legend);
  return panel;
}

// Metric points of one run, kept up to date by polling from the last byte offset.
class LiveMetrics {
  constructor(runId) {
    this.runId = runId;
    this.next = 0;
    this.series = new Map(); // key -> [[step, value], ...]
  }

  async poll() {
    const keys = PANELS.flatMap((p) => p.keys).map((k) => `key=${encodeURIComponent(k)}`);
    const url = `${apiRun(this.runId)}/metrics?since=${this.next}&${keys.join("&")}`;
    const body = await getJSON(url);
    if (body.reset) this.series.clear();
    for (const point of body.points) {
      for (const [key, value] of Object.entries(point.values)) {
        if (!this.series.has(key)) this.series.set(key, []);
        this.series.get(key).push([point.step, value]);
      }
    }
    this.next = body.next;
    return body.points.length > 0 || body.reset;
  }

  // The keys of this run that a panel's patterns match.
  keysFor(panel) {
    const matches = (key, pattern) =>
      new RegExp(`^${pattern.split("*").map((s) => s.replace(/[.+?^${}()|[\]\\/]/g, "\\$&"))
        .join("[^]*")}$`).test(key);
    return [...this.series.keys()].filter((k) => panel.keys.some((p) => matches(k, p))).sort();
  }
}

// A panel that cannot be drawn says why in one line; the other panels still draw.
function panelOrError(title, draw) {
  try {
    return draw();
  } catch (error) {
    return el("div", { class: "panel", "data-title": title }, el("h3", {}, title),
      el("div", { class: "empty panel-error" }, `cannot draw this panel: ${error.message}`));
  }
}

function drawPanels(container, runs) {
  container.replaceChildren(...PANELS.map((panel) => panelOrError(panel.title, () => {
    const series = [];
    runs.forEach((run, r) => {
      run.metrics.keysFor(panel).forEach((key, k) => {
        series.push({
          label: runs.length > 1 ? `${run.label}: ${key}` : key,
          color: COLORS[(runs.length > 1 ? r : k) % COLORS.length],
          dash: runs.length > 1 && k > 0,
          points: run.metrics.series.get(key),
        });
      });
    });
    return chart(panel.title, series);
  })));
}

// Panels for runs [{id, label}], redrawn whenever a poll brings new points.
async function livePanels(container, runs) {
  const live = runs.map((run) => ({ ...run, metrics: new LiveMetrics(run.id) }));
  const refresh = async () => {
    const changed = await Promise.all(live.map((run) => run.metrics.poll()));
    if (changed.some(Boolean)) drawPanels(container, live);
  };
  // the episodes below must show even when the curves cannot be read
  const said = (e) => container.replaceChildren(el("p", { class: "note panel-error" },
    `curves: ${e.message}`));
  await refresh().then(() => drawPanels(container, live)).catch(said);
  every(POLL_MS, container, () => refresh().catch((e) => showError(e.message)));
}

// ---- views ---------------------------------------------------------------------------------

async function showRuns(app) {
  const selected = new Set();
  const compare = el("button", { id: "compare-button", disabled: true, onclick: () => {
    const [a, b] = [...selected];
    location.hash = `#/compare/${encodeURIComponent(a)}/${encodeURIComponent(b)}`;
  } }, "Compare the two selected runs");
  const table = el("table", { id: "runs" });
  app.append(el("h1", {}, "Runs"), table, el("p", {}, compare));

  const row = (run) => {
    const box = el("input", { type: "checkbox", checked: selected.has(run.id), onchange: (e) => {
      if (e.target.checked) selected.add(run.id);
      else selected.delete(run.id);
      compare.disabled = selected.size !== 2;
    } });
    const figures = Object.entries(run.figures || {}).map(([k, v]) => `${k} ${fmt(v)}`);
    return el("tr", { "data-run": run.id },
      el("td", {}, box), el("td", {}, el("a", { href: runLink(run.id) }, run.id)),
      el("td", {}, run.name), el("td", {}, run.kind), statusCell(run.status),
      el("td", {}, fmt(run.step)), el("td", {}, run.created_at), el("td", {}, figures.join(", ")));
  };
  const refresh = async () => {
    const { runs } = await getJSON("api/runs");
    const head = el("tr", {}, ["", "id", "name", "kind", "status", "step", "created", "figures"]
      .map((h) => el("th", {}, h)));
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, runs.map(row)));
  };
  await refresh();
  every(RUNS_POLL_MS, table, () => refresh().catch((e) => showError(e.message)));
}

async function showRun(app, runId) {
  const run = await getJSON(apiRun(runId));
  document.getElementById("where").textContent = `/ ${run.name || run.id}`;
  const panels = el("div", { class: "panels", id: "curves" });
  const list = el("div", { id: "trajectories" });
  const health = el("div", { id: "health" });
  app.append(
    // <bdi>: a bidi override in a name reorders the name alone, not the status after it
    el("h1", {}, el("bdi", {}, run.name || run.id), " ",
      el("span", { class: `status-${run.status}` }, run.status)),
    el("p", { class: "note" }, `${run.kind} · step ${fmt(run.step)} · ${run.run_dir}`),
    ...(HEALTHY_KINDS.has(run.kind) ? [el("h2", {}, "Health"), health] : []),
    el("h2", {}, "Curves"), panels, el("h2", {}, "Trajectories"), list,
  );
  if (HEALTHY_KINDS.has(run.kind)) await liveHealth(health, run.id);
  await livePanels(panels, [{ id: run.id, label: run.name || run.id }]);
  await trajectoryList(list, run.id);
}

// Kinds whose runs the health rules read: a train run's metrics, an eval's episodes, an
// sft run's record.
const HEALTHY_KINDS = new Set(["train", "eval", "sft"]);

// A run's findings (docs/troubleshooting.md), refreshed while the page shows them.
async function liveHealth(container, runId) {
  async function refresh() {
    const { findings, why } = await getJSON(`${apiRun(runId)}/health`);
    const rows = findings.map((f) => el("li", { class: "finding" },
      el("strong", {}, `[${f.rule}] ${f.title}`), `: ${f.evidence}`,
      el("div", { class: "note" }, `fix: ${f.fix}`)));
    const none = el("p", { class: "note" }, why || "no known problem in its figures");
    container.replaceChildren(rows.length ? el("ul", {}, rows) : none);
  }
  // the curves and episodes below must show even when the health cannot be read
  const said = (e) => container.replaceChildren(el("p", { class: "note" }, `health: ${e.message}`));
  await refresh().catch(said);
  every(RUNS_POLL_MS, container, () => refresh().catch(said));
}

async function showCompare(app, a, b) {
  const runs = await Promise.all([a, b].map((id) => getJSON(apiRun(id))));
  document.getElementById("where").textContent = `/ compare`;
  const panels = el("div", { class: "panels", id: "curves" });
  app.append(el("h1", {}, "Compare ",
    ...runs.flatMap((r, i) => [i ? " vs " : "",
      el("a", { href: runLink(r.id) }, el("bdi", {}, r.name || r.id))])),
    panels);
  await livePanels(panels, runs.map((r) => ({ id: r.id, label: r.name || r.id })));
}

function filterForm(onApply) {
  const number = (name, label) =>
    el("label", {}, label, el("input", { type: "number", step: "any", name }));
  const status = el("select", { name: "status" }, el("option", { value: "" }, "any"),
    STATUSES.map((s) => el("option", { value: s }, s)));
  const form = el("form", { class: "filters", id: "filters" },
    number("min_reward", "reward ≥"), number("max_reward", "reward ≤"),
    el("label", {}, "status", status), number("step", "step"),
    el("label", {}, "tool errors", el("input", { type: "checkbox", name: "tool_errors" })),
    el("label", {}, "length outliers", el("input", { type: "checkbox", name: "length_outliers" })),
    el("label", {}, "results cut", el("input", { type: "checkbox", name: "results_cut" })),
    el("label", {}, "turns cut", el("input", { type: "checkbox", name: "turns_cut" })),
    el("button", { type: "submit" }, "Apply"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [key, value] of new FormData(form)) {
      if (value !== "") query.set(key, value === "on" ? "true" : value);
    }
    onApply(query);
  });
  return form;
}

async function trajectoryList(container, runId) {
  let query = new URLSearchParams();
  let offset = 0;
  const table = el("table", { id: "trajectory-table" });
  const info = el("span", { id: "page-info" });
  const prev = el("button", { id: "prev-page", onclick: () => load(offset - PAGE_SIZE) }, "‹ prev");
  const next = el("button", { id: "next-page", onclick: () => load(offset + PAGE_SIZE) }, "next ›");
  container.append(filterForm((q) => { query = q; load(0); }),
    el("div", { class: "pager" }, prev, info, next), table);

  async function load(start) {
    const params = new URLSearchParams(query);
    params.set("offset", Math.max(0, start));
    params.set("limit", PAGE_SIZE);
    const page = await getJSON(`${apiRun(runId)}/trajectories?${params}`);
    offset = page.offset;
    const last = offset + page.items.length;
    info.textContent = `${page.items.length ? offset + 1 : 0}–${last} of ${page.matched} matching`
      + ` (${page.total} in the run${page.bad_lines ? `, ${page.bad_lines} unreadable lines` : ""})`;
    prev.disabled = offset === 0;
    next.disabled = last >= page.matched;
    const head = el("tr", {}, ["#", "step", "status", "reward", "scores", "turns", "tool calls",
      "tool errors", "results cut", "length", "prompt"].map((h) => el("th", {}, h)));
    const rows = page.items.map((t) => {
      const href = `${runLink(runId)}/traj/${t.index}`;
      const scores = Object.entries(t.scores).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
      return el("tr", { class: "clickable", "data-index": t.index, onclick: () => {
        location.hash = href;
      } },
      el("td", {}, el("a", { href }, t.index)), el("td", {}, fmt(t.step)), statusCell(t.status),
      el("td", {}, fmt(t.reward)), el("td", {}, scores), el("td", {}, t.turns),
      el("td", {}, t.tool_calls), el("td", {}, t.tool_errors), el("td", {}, t.results_cut),
      el("td", {}, t.length),
      el("td", {}, t.preview));
    });
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, rows));
  }
  await load(0);
}

function messageView(message, index) {
  const { role, content, tool_calls: calls, name, tool_call_id: callId, ...rest } = message;
  const title = [role, name, callId ? `result of ${callId}` : null].filter(Boolean).join(" · ");
  const box = el("div", { class: `msg role-${role}${role === "tool" ? " tool-result" : ""}`,
    "data-message": index }, el("div", { class: "role" }, title));
  if (content != null && content !== "") {
    const text = typeof content === "string" ? content : JSON.stringify(content, null, 1);
    box.append(el("pre", { class: "content" }, text)); // as the model saw it, not reformatted
  }
  for (const call of calls || []) {
    const fn = call.function || {};
    box.append(el("div", { class: "tool-call", "data-call": call.id || "" },
      el("div", {}, el("b", {}, `tool call ${fn.name}`), call.id ? ` · ${call.id}` : ""),
      el("pre", {}, pretty(fn.arguments))));
  }
  for (const [key, value] of Object.entries(rest)) {
    box.append(el("div", { class: "extra" }, el("b", {}, key), el("pre", {}, pretty(value))));
  }
  return box;
}

function tokenView(tokens) {
  const section = el("div", { id: "loss-mask" }, el("p", { class: "note" },
    `${tokens.mode} · ${tokens.tokenizer} · `, el("span", { class: "tok m1" }, "trained (mask 1)"),
    " ", el("span", { class: "tok m0" }, "not trained (mask 0)")));
  for (const seq of tokens.sequences) {
    const spans = seq.ids.map((id, i) => {
      const piece = seq.pieces ? seq.pieces[i] : null;
      const text = piece == null ? `${id} ` : piece === "" ? `[${id}]` : piece;
      return el("span", { class: `tok m${seq.mask[i]}`, title: `id ${id} · mask ${seq.mask[i]}` },
        text);
    });
    section.append(el("h3", {}, seq.label), el("div", { class: "tokens" }, spans));
  }
  return section;
}

function keyValues(pairs) {
  return el("dl", { class: "kv" }, pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

async function showTrajectory(app, runId, index) {
  const t = await getJSON(`${apiRun(runId)}/trajectories/${index}`);
  document.getElementById("where").textContent = `/ ${runId} / trajectory ${index}`;
  const nav = el("p", {}, el("a", { href: runLink(runId) }, "← run"), " ",
    index > 0 ? el("a", { href: `${runLink(runId)}/traj/${index - 1}` }, "‹ previous") : null,
    " ", el("a", { href: `${runLink(runId)}/traj/${index + 1}` }, "next ›"));
  const scores = Object.entries(t.scores).map(([k, v]) => [`score ${k}`, fmt(v)]);
  const turnHead = el("tr", {}, ["turn", "finish", "tokens", "reward", "tool errors", "results cut",
    "adapter"]
    .map((h) => el("th", {}, h)));
  const turns = t.turns.map((turn, k) => el("tr", {}, el("td", {}, k),
    el("td", {}, turn.finish_reason), el("td", {}, turn.completion_tokens),
    el("td", {}, fmt(turn.reward)), el("td", {}, el("pre", {}, turn.tool_errors.join("\n"))),
    el("td", {}, turn.tool_results_cut), el("td", {}, fmt(turn.adapter_version))));
  app.append(nav, el("h1", {}, `Trajectory ${index}`),
    keyValues([["status", el("span", { class: `status-${t.status}` }, t.status)],
      ["total reward", fmt(t.total_reward)], ["final reward", fmt(t.final_reward)], ...scores,
      ["env", t.env_id], ["task", `#${fmt(t.task_index)} · group ${t.group_index}`],
      ["mode", fmt(t.mode)], ["step", fmt(t.info.step)]]),
    t.error ? el("pre", { class: "error" }, t.error) : null,
    el("h2", {}, "Task"), el("pre", {}, pretty(t.task)),
    el("h2", {}, "Messages"), el("div", { id: "messages" }, t.messages.map(messageView)),
    el("h2", {}, "Turns"), el("table", {}, el("thead", {}, turnHead), el("tbody", {}, turns)),
    el("h2", {}, "Loss mask"), tokenView(t.tokens),
    el("h2", {}, "Info and timings"), el("pre", {}, pretty({ info: t.info, timings: t.timings })));
}

// ---- routing -------------------------------------------------------------------------------

async function route() {
  timers.forEach(clearInterval);
  timers = [];
  showError("");
  document.getElementById("where").textContent = "";
  const app = el("div");
  document.getElementById("app").replaceChildren(app);
  const [view, ...args] = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  try {
    if (view === "run" && args[1] === "traj") await showTrajectory(app, args[0], Number(args[2]));
    else if (view === "run") await showRun(app, args[0]);
    else if (view === "compare") await showCompare(app, args[0], args[1]);
    else await showRuns(app);
    document.getElementById("app").setAttribute("data-ready", location.hash);
  } catch (error) {
    showError(error.message);
  }
}

window.addEventListener("hashchange", route);
route();
