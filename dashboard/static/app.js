// The edged dashboard: polls the node's REST API (same origin) and draws
// the job, checkpoint, ingest and cluster views. No dependencies.

const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
const $ = (sel) => document.querySelector(sel);

const state = {
  view: "job",
  job: "",
  jobs: [],
  prevTasks: null, // {t, byKey}
  prevIngest: null, // {t, byName}
  graphKey: "",
  graph: null,
  rates: new Map(), // chain name -> {in, out, bp, wmLag}
  cluster: null, // the latest GET /cluster of an enabled cluster
  // On a cluster's worker: {node, leader, note}. The jobs are the job
  // masters', on the leader; the worker lists them (GET /jobs?cluster=1)
  // but answers none of a job's own endpoints.
  worker: null,
};

// ---- helpers -------------------------------------------------------------

async function api(path, opts = {}) {
  const r = await fetch(path, { credentials: "same-origin", ...opts });
  let body = null;
  try { body = await r.json(); } catch { /* not JSON */ }
  if (r.status === 401) {
    banner("This node requires a token: open the dashboard once as /?token=<token> (the token is node.token, or the one the node logged at start).");
  }
  if (!r.ok) throw new Error((body && body.error) || `HTTP ${r.status}`);
  return body;
}

function banner(text) {
  const b = $("#banner");
  b.textContent = text;
  b.hidden = !text;
}

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function sv(tag, attrs = {}, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtRate(v) {
  if (v === undefined || v === null || !isFinite(v)) return "–";
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e4) return (v / 1e3).toFixed(0) + "k";
  if (v >= 100) return v.toFixed(0);
  return v.toFixed(1);
}
function fmtBytes(b) {
  if (b === undefined || b === null) return "–";
  const u = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b) + " " + u[i];
}
function fmtMs(ms) {
  if (ms === undefined || ms === null || !isFinite(ms)) return "–";
  if (ms >= 60000) return (ms / 60000).toFixed(1) + " min";
  if (ms >= 1000) return (ms / 1000).toFixed(2) + " s";
  return ms.toFixed(ms < 10 ? 1 : 0) + " ms";
}
function fmtTime(iso) {
  const d = new Date(iso);
  return isNaN(d) ? "" : d.toLocaleTimeString();
}
function tbodyRows(table, rows, empty) {
  const tb = $(table).tBodies[0];
  tb.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { class: "empty", colspan: "9" }, empty))]));
}

// ---- views ---------------------------------------------------------------

function showView(v) {
  state.view = ["job", "checkpoints", "ingest", "cluster"].includes(v) ? v : "job";
  for (const s of document.querySelectorAll(".view")) s.hidden = s.id !== "view-" + state.view;
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === state.view);
  tick();
}

async function refreshJobs() {
  // cluster=1: on a worker, the leader's jobs with the tasks this node
  // hosts; elsewhere the node's own, as plain /jobs.
  const l = await api("/jobs?cluster=1");
  state.jobs = l.jobs || [];
  state.worker = l.node && l.leader !== l.node ? { node: l.node, leader: l.leader || "", note: l.note || "" } : null;
  renderWorkerNote();
  const sel = $("#job-select");
  const names = state.jobs.map((j) => j.name);
  if (sel.options.length !== names.length || [...sel.options].some((o, i) => o.value !== names[i])) {
    sel.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  }
  if (!names.includes(state.job)) state.job = names[0] || "";
  sel.value = state.job;
}

function currentJob() { return state.jobs.find((j) => j.name === state.job); }

// leaderDashboard returns the URL of the leader's dashboard, when this
// node knows the leader's API address.
function leaderDashboard(view) {
  const c = state.cluster, w = state.worker;
  const leader = w ? w.leader : c && c.leader;
  const m = c && c.members ? c.members.find((x) => x.id === leader) : null;
  return m && m.api ? `http://${m.api}/#${view}` : "";
}

// leaderRef names the leader (a link to its dashboard when its API is
// known) for a note on a worker.
function leaderRef(leader, view) {
  if (!leader) return "no node (none leads now)";
  const url = leaderDashboard(view);
  return url ? el("span", {}, `node ${leader} (`, el("a", { href: url, class: "leader-link" }, url), ")") : `node ${leader}`;
}

// renderWorkerNote says, on a worker's job and checkpoint views, where the
// job's graph, tasks, dead letters and checkpoints are: this node runs
// none of the job masters.
function renderWorkerNote() {
  const n = $("#worker-note");
  const w = state.worker;
  n.hidden = !w || (state.view !== "job" && state.view !== "checkpoints");
  if (!w) return;
  const text = [`Node ${w.node} is a worker: the jobs run under the job masters of `, leaderRef(w.leader, state.view),
    ", which keeps their graphs, tasks, dead letters and checkpoints, and takes savepoints, stops and cancels. This node lists their status and the tasks it hosts."];
  if (w.note) text.push(" " + w.note);
  n.replaceChildren(...text);
}

function renderCards() {
  const j = currentJob();
  if (!j) { $("#job-cards").replaceChildren(el("div", { class: "empty" }, "no jobs")); return; }
  const card = (k, v, cls = "") => el("div", { class: "card" }, el("div", { class: "k" }, k), el("div", { class: "v " + cls }, v));
  const cards = [
    card("job", j.name),
    card("status", j.status, "status-" + j.status),
    card("attempts", j.attempts),
    card("checkpointing", j.checkpointing ? "on" : "off"),
    card("dead letters", j.dead_letters, j.dead_letters ? "warn" : ""),
  ];
  if (state.worker && j.tasks_here !== undefined) cards.push(card("tasks here", j.tasks_here));
  if (j.error) cards.push(card("error", j.error, "bad"));
  else if (j.last_failure) cards.push(card("last failure", j.last_failure, j.status === "restarting" ? "bad" : "warn"));
  $("#job-cards").replaceChildren(...cards);
}

async function refreshTasks() {
  const l = await api(`/jobs/${encodeURIComponent(state.job)}/operators`);
  const now = performance.now();
  const byKey = new Map();
  for (const t of l.tasks) byKey.set(t.chain + "#" + t.subtask, t);
  const prev = state.prevTasks && state.prevTasks.job === state.job ? state.prevTasks : null;
  const dt = prev ? (now - prev.t) / 1000 : 0;
  const rows = [];
  const chains = new Map();
  for (const t of l.tasks) {
    const p = prev && prev.byKey.get(t.chain + "#" + t.subtask);
    const rin = p && dt > 0 ? Math.max(0, t.records_in - p.records_in) / dt : NaN;
    const rout = p && dt > 0 ? Math.max(0, t.records_out - p.records_out) / dt : NaN;
    const bp = p && dt > 0 ? Math.min(1, Math.max(0, t.backpressure_ms - p.backpressure_ms) / (dt * 1000)) : NaN;
    const lag = t.watermark_ms !== undefined ? Math.max(0, Date.now() - t.watermark_ms) : NaN;
    const c = chains.get(t.chain) || { in: 0, out: 0, bp: 0, wmLag: NaN, known: false };
    if (!isNaN(rin)) { c.in += rin; c.out += rout; c.bp = Math.max(c.bp, bp); c.known = true; }
    if (!isNaN(lag)) c.wmLag = isNaN(c.wmLag) ? lag : Math.max(c.wmLag, lag);
    chains.set(t.chain, c);
    rows.push(el("tr", { "data-chain": t.chain },
      el("td", {}, t.chain), el("td", {}, `${t.subtask + 1}/${t.parallelism}`),
      el("td", { class: "num rate-in" }, fmtRate(rin)), el("td", { class: "num rate-out" }, fmtRate(rout)),
      el("td", { class: "num" + (bp > 0.5 ? " bad" : "") }, isNaN(bp) ? "–" : (bp * 100).toFixed(0) + " %"),
      el("td", { class: "num" }, t.queued), el("td", { class: "num" }, fmtMs(lag))));
  }
  state.prevTasks = { job: state.job, t: now, byKey };
  state.rates = chains;
  tbodyRows("#tasks", rows, "no running attempt");
}

async function refreshGraph() {
  try {
    const g = await api(`/jobs/${encodeURIComponent(state.job)}/graph`);
    const key = state.job + JSON.stringify(g);
    if (key !== state.graphKey) { state.graphKey = key; state.graph = g; }
  } catch (e) {
    state.graph = null; state.graphKey = "";
  }
  drawGraph();
}

function drawGraph() {
  const svg = $("#graph");
  const g = state.graph;
  svg.replaceChildren();
  if (!g || !g.chains.length) {
    svg.setAttribute("width", 400); svg.setAttribute("height", 40);
    svg.append(sv("text", { x: 10, y: 25, class: "metric" }, "no running attempt: the graph shows while the job runs"));
    return;
  }
  // Layers: a chain sits one column right of the furthest chain feeding it.
  const layer = new Map(g.chains.map((c) => [c.id, 0]));
  for (const c of g.chains) for (const e of g.edges) if (e.to === c.id) layer.set(c.id, Math.max(layer.get(c.id), layer.get(e.from) + 1));
  const W = 206, GAPX = 150, GAPY = 16, PAD = 12;
  const heightOf = (c) => 34 + c.operators.length * 17 + 3 * 17 + 8;
  const cols = new Map();
  for (const c of g.chains) { const l = layer.get(c.id); if (!cols.has(l)) cols.set(l, []); cols.get(l).push(c); }
  const pos = new Map();
  let maxH = 0;
  for (const [l, cs] of cols) {
    let y = PAD;
    for (const c of cs) { const h = heightOf(c); pos.set(c.id, { x: PAD + l * (W + GAPX), y, h }); y += h + GAPY; }
    maxH = Math.max(maxH, y);
  }
  const width = PAD * 2 + cols.size * W + (cols.size - 1) * GAPX;
  // Scale down to the panel's width, never up.
  const avail = Math.max(320, svg.parentElement.clientWidth - 20);
  const scale = Math.min(1, avail / width);
  svg.setAttribute("width", Math.round(width * scale)); svg.setAttribute("height", Math.round((maxH + PAD) * scale));
  svg.setAttribute("viewBox", `0 0 ${width} ${maxH + PAD}`);
  const defs = sv("defs");
  const m = sv("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" });
  m.append(sv("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }));
  defs.append(m); svg.append(defs);
  const labels = [];
  for (const e of g.edges) {
    const a = pos.get(e.from), b = pos.get(e.to);
    const x1 = a.x + W, y1 = a.y + a.h / 2, x2 = b.x - 2, y2 = b.y + b.h / 2;
    const mx = (x1 + x2) / 2;
    svg.append(sv("path", { d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, class: "edge" + (e.side_output ? " side" : ""), "marker-end": "url(#arrow)" }));
    labels.push({ x: mx, y: (y1 + y2) / 2, text: e.side_output ? `${e.partitioner} · ${e.side_output}` : e.partitioner });
  }
  for (const c of g.chains) {
    const p = pos.get(c.id);
    const grp = sv("g", { class: "chain", "data-chain": c.name, transform: `translate(${p.x},${p.y})` });
    grp.append(sv("rect", { class: "box" + (c.source ? " source" : c.sink ? " sink" : ""), width: W, height: p.h, rx: 8 }));
    grp.append(sv("text", { x: 12, y: 21, class: "title" }, `${c.source ? "source" : c.sink ? "sink" : "chain"} · parallelism ${c.parallelism}`));
    c.operators.forEach((op, i) => grp.append(sv("text", { x: 12, y: 42 + i * 17, class: "op" }, short(op))));
    const r = state.rates.get(c.name);
    const y0 = 42 + c.operators.length * 17 + 6;
    const rin = r && r.known ? fmtRate(r.in) : "–", rout = r && r.known ? fmtRate(r.out) : "–";
    const rates = c.source ? `out ${rout}/s` : c.sink ? `in ${rin}/s` : `in ${rin}/s · out ${rout}/s`;
    grp.append(sv("text", { x: 12, y: y0, class: "metric rates" }, rates));
    const bp = r && r.known ? r.bp : NaN;
    grp.append(sv("text", { x: 12, y: y0 + 17, class: "metric" + (bp > 0.5 ? " hot" : "") }, `backpressure ${isNaN(bp) ? "–" : (bp * 100).toFixed(0) + " %"}`));
    grp.append(sv("text", { x: 12, y: y0 + 34, class: "metric" }, `watermark lag ${r ? fmtMs(r.wmLag) : "–"}`));
    svg.append(grp);
  }
  for (const l of labels) {
    const w = l.text.length * 6 + 10;
    svg.append(sv("rect", { x: l.x - w / 2, y: l.y - 10, width: w, height: 18, rx: 4, class: "elabel-bg" }));
    svg.append(sv("text", { x: l.x, y: l.y + 4, "text-anchor": "middle", class: "elabel" }, l.text));
  }
}

function short(op) {
  const s = op.includes("/") ? op.slice(op.indexOf("/") + 1) : op;
  return s.length > 28 ? s.slice(0, 27) + "…" : s;
}

async function refreshDeadLetters() {
  const l = await api(`/jobs/${encodeURIComponent(state.job)}/deadletters?n=5`);
  const byNode = l.by_node ? " (" + Object.entries(l.by_node).sort().map(([n, c]) => `${n}: ${c}`).join(", ") + ")" : "";
  $("#dl-total").textContent = (l.recent.length ? `${l.total} in all; the last ${l.recent.length}, newest first` : `${l.total} in all`) + byNode;
  const items = l.recent.map((d) => el("li", {}, el("div", { class: "err" }, d.node ? nodeChip(d.node) : "", d.error), el("div", { class: "payload" }, d.payload)));
  $("#deadletters").replaceChildren(...(items.length ? items : [el("li", { class: "empty" }, "none")]));
}

async function refreshCheckpoints() {
  const l = await api(`/jobs/${encodeURIComponent(state.job)}/checkpoints`);
  const cps = l.checkpoints || [];
  drawChart(cps);
  const last = cps.slice(-12).reverse();
  tbodyRows("#checkpoints", last.map((c) => el("tr", { class: c.status === "failed" ? "bad" : "" },
    el("td", {}, c.id), el("td", {}, c.kind + (c.stop ? " (stop)" : "")),
    el("td", { class: c.status === "failed" ? "bad" : c.gone ? "warn gone" : c.status === "completed" ? "ok" : "" }, c.status + (c.gone ? " (files gone)" : ""), c.error ? el("div", { class: "err" }, c.error) : ""),
    el("td", { class: "num" }, c.status === "in_progress" ? "…" : fmtMs(c.duration_ms)),
    el("td", { class: "num" }, fmtBytes(c.size_bytes)), el("td", { class: "num" }, fmtMs(c.alignment_ms)),
    el("td", {}, fmtTime(c.trigger_time)),
    // The path to start from (--from-savepoint): one click selects it
    // whole; struck through once its files are gone.
    el("td", { class: "path" + (c.gone ? " gone" : ""), title: c.gone ? "files gone" : "" }, c.status === "completed" && c.path ? c.path : ""))), state.job ? "no checkpoint yet" : "no job");
  const sps = cps.filter((c) => c.kind === "savepoint" && c.status === "completed" && c.path).reverse();
  const j = currentJob();
  if (j && j.savepoint && !sps.some((s) => s.path === j.savepoint)) sps.unshift({ path: j.savepoint, id: "", trigger_time: "" });
  // A savepoint whose files are gone (removed, or discarded) stays listed,
  // marked, so that nobody copies its path for --from-savepoint.
  $("#savepoints").replaceChildren(...(sps.length ? sps.slice(0, 8).map((s) => el("li", { class: s.gone ? "gone" : "" },
    el("div", { class: "path" }, s.path),
    el("div", { class: "meta" }, (s.id !== "" ? `#${s.id} · ${fmtTime(s.trigger_time)} · ${fmtBytes(s.size_bytes)}${s.stop ? " · stopped the job" : ""}` : "latest savepoint") + (s.gone ? " · files gone" : ""))))
    : [el("li", { class: "empty" }, "no savepoint yet")]));
  const running = j && j.status === "running";
  for (const b of ["#btn-savepoint", "#btn-stop", "#btn-cancel"]) $(b).disabled = !running || state.busy;
  // A job waiting to restart can be cancelled.
  if (j && j.status === "restarting") $("#btn-cancel").disabled = state.busy;
  if (j && !j.checkpointing) { $("#btn-savepoint").disabled = true; $("#btn-stop").disabled = true; }
}

function drawChart(cps) {
  const svg = $("#cp-chart");
  svg.replaceChildren();
  const W = Math.max(600, svg.clientWidth || 900), H = 220, L = 60, R = 70, T = 14, B = 30;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`); svg.setAttribute("height", H);
  const done = cps.filter((c) => c.status !== "in_progress");
  if (!done.length) { svg.append(sv("text", { x: L, y: H / 2, class: "tick" }, "no checkpoint yet")); return; }
  const maxD = Math.max(1, ...done.map((c) => Math.max(c.duration_ms, c.alignment_ms)));
  const maxS = Math.max(1, ...done.map((c) => c.size_bytes));
  const pw = W - L - R, ph = H - T - B, step = pw / done.length, bw = Math.max(3, Math.min(28, step * 0.6));
  svg.append(sv("line", { x1: L, y1: T + ph, x2: L + pw, y2: T + ph, class: "axis" }));
  for (const f of [0, 0.5, 1]) {
    const y = T + ph - f * ph;
    svg.append(sv("line", { x1: L, y1: y, x2: L + pw, y2: y, class: "axis" }));
    svg.append(sv("text", { x: L - 6, y: y + 4, "text-anchor": "end", class: "tick" }, fmtMs(maxD * f)));
    svg.append(sv("text", { x: L + pw + 6, y: y + 4, class: "tick" }, fmtBytes(Math.round(maxS * f))));
  }
  let line = "";
  done.forEach((c, i) => {
    const x = L + i * step + step / 2;
    const failed = c.status === "failed";
    const h = failed ? ph : Math.max(1, (c.duration_ms / maxD) * ph);
    const bar = sv("rect", { x: x - bw / 2, y: T + ph - h, width: bw, height: h, class: "bar " + c.kind + (failed ? " failed" : ""), "data-id": c.id });
    bar.append(sv("title", {}, `#${c.id} ${c.kind} ${c.status}: ${fmtMs(c.duration_ms)}, ${fmtBytes(c.size_bytes)}, alignment ${fmtMs(c.alignment_ms)}${c.error ? "\n" + c.error : ""}`));
    svg.append(bar);
    if (failed) svg.append(sv("text", { x, y: T + 10, "text-anchor": "middle", class: "fail-mark" }, "✕"));
    else {
      const ys = T + ph - (c.size_bytes / maxS) * ph;
      line += (line ? " L" : "M") + `${x},${ys}`;
      svg.append(sv("circle", { cx: x, cy: T + ph - (c.alignment_ms / maxD) * ph, r: 3, class: "align" }));
    }
    if (done.length <= 30 || i % Math.ceil(done.length / 30) === 0) svg.append(sv("text", { x, y: H - 10, "text-anchor": "middle", class: "tick" }, c.id));
  });
  if (line) svg.append(sv("path", { d: line, class: "size" }));
}

async function refreshIngest() {
  const [l, b] = await Promise.all([api("/ingest"), api("/broker/clients")]);
  const now = performance.now();
  const prev = state.prevIngest;
  const dt = prev ? (now - prev.t) / 1000 : 0;
  const byName = new Map(l.pipelines.map((p) => [p.pipeline, p]));
  tbodyRows("#ingest", l.pipelines.map((p) => {
    const q = prev && prev.byName.get(p.pipeline);
    const rin = q && dt > 0 ? (p.appends - q.appends) / dt : NaN;
    const rout = q && dt > 0 ? Math.max(0, p.released_offset - q.released_offset) / dt : NaN;
    return el("tr", { "data-pipeline": p.pipeline }, el("td", {}, p.pipeline), el("td", { class: "num" }, fmtBytes(p.disk_bytes)),
      el("td", { class: "num" }, p.segments), el("td", { class: "num" }, fmtRate(rin)), el("td", { class: "num" }, fmtRate(rout)),
      el("td", { class: "num" }, p.lag_records), el("td", { class: "num" }, p.next_offset),
      el("td", { class: "num" + (p.waiting ? " bad" : "") }, p.blocked + (p.waiting ? ` (${p.waiting} waiting)` : "")));
  }), "no pipeline reads MQTT");
  state.prevIngest = { t: now, byName };
  $("#broker-addr").textContent = b.embedded ? `embedded broker on ${b.address}` : "no embedded broker on this node";
  tbodyRows("#clients", b.clients.map((c) => el("tr", {}, el("td", {}, c.id), el("td", {}, c.remote), el("td", {}, c.listener),
    el("td", { class: "num" }, c.protocol_version), el("td", {}, c.clean_session ? "yes" : "no"))), "no client connected");
}

// renderWorkerViews empties the job and checkpoint views of a worker,
// whose API answers none of a job's endpoints, saying where they are.
function renderWorkerViews() {
  const where = `on the leader, node ${state.worker.leader || "(none now)"}`;
  if (state.view === "job") {
    state.graph = null; state.graphKey = "";
    const svg = $("#graph");
    svg.replaceChildren(sv("text", { x: 10, y: 25, class: "metric" }, `the job graph is ${where}`));
    svg.setAttribute("width", 400); svg.setAttribute("height", 40);
    tbodyRows("#tasks", [], `the tasks' rates are ${where}`);
    $("#dl-total").textContent = "";
    $("#deadletters").replaceChildren(el("li", { class: "empty" }, `the dead letters are ${where}`));
  } else if (state.view === "checkpoints") {
    const svg = $("#cp-chart");
    svg.replaceChildren(sv("text", { x: 60, y: 110, class: "tick" }, `the checkpoint history is ${where}`));
    tbodyRows("#checkpoints", [], `the checkpoints are ${where}`);
    $("#savepoints").replaceChildren(el("li", { class: "empty" }, `the savepoints are ${where}`));
    for (const b of ["#btn-savepoint", "#btn-stop", "#btn-cancel"]) $(b).disabled = true;
  }
}

// ---- cluster --------------------------------------------------------------

// Node colours of the key-group map, the legend and the replica chips, by
// the node's place among the members (sorted by id), so they stay put.
const NODE_COLORS = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#e15759", "#9c755f", "#bab0ac", "#ff9da7"];

function nodeColor(id) {
  const c = state.cluster;
  const i = c && c.members ? c.members.findIndex((m) => m.id === id) : -1;
  return i < 0 ? "#c9d3de" : NODE_COLORS[i % NODE_COLORS.length];
}

function nodeChip(id) {
  const chip = el("span", { class: "chip", "data-node": id }, el("span", { class: "swatch" }), id);
  chip.firstChild.style.background = nodeColor(id); // CSSOM, allowed by the page's CSP
  return chip;
}

// refreshClusterNav fetches /cluster now and then outside the cluster view,
// to show the Cluster tab only on a node that runs a cluster.
let clusterNavAt = 0;
async function refreshClusterNav() {
  if (Date.now() - clusterNavAt < 10000) return;
  clusterNavAt = Date.now();
  try {
    const c = await api("/cluster");
    state.cluster = c.enabled ? c : null;
    setClusterEnabled(c.enabled);
  } catch { /* shown by the next tick */ }
}

function setClusterEnabled(on) {
  $('nav a[data-view="cluster"]').hidden = !on;
  $("#cluster-off").hidden = on;
  $("#cluster-on").hidden = !on;
}

async function refreshCluster() {
  const c = await api("/cluster");
  clusterNavAt = Date.now();
  state.cluster = c.enabled ? c : null;
  setClusterEnabled(c.enabled);
  if (!c.enabled) return;
  const owned = new Map(), subtasks = new Map();
  for (const p of c.placement) {
    subtasks.set(p.node, p.subtasks.length);
    owned.set(p.node, p.subtasks.reduce((n, s) => n + Math.max(0, s.key_groups[1] - s.key_groups[0] + 1), 0));
  }
  const me = c.members.find((m) => m.id === c.node);
  const alive = c.members.filter((m) => m.state === "alive").length;
  // The placement, the failovers and the rebalances are the job masters',
  // on the leader: a worker holds none of them, and its zeros would read
  // as a cluster that runs nothing and never failed over.
  const follower = !!c.leader && c.leader !== c.node;
  // Failovers begun and not done: their jobs do not run again yet.
  const inProgress = c.failovers_in_progress || [];
  const elsewhere = follower && !c.placement.length;
  const count = (n) => elsewhere ? el("span", { class: "muted", title: `kept by the leader, node ${c.leader}` }, "–") : n;
  const card = (k, v, cls = "") => el("div", { class: "card" }, el("div", { class: "k" }, k), el("div", { class: "v " + cls }, v));
  $("#cluster-cards").replaceChildren(
    card("this node", c.node),
    card("leader", c.leader || "none", c.leader ? "" : "bad"),
    card("epoch", c.epoch),
    card("members alive", `${alive} / ${c.members.length}`, alive < c.members.length ? "warn" : "ok"),
    card("majority", me && me.sees_majority ? "seen" : "not seen", me && me.sees_majority ? "ok" : "bad"),
    card("failovers", (follower && !c.failovers_total ? "–" : c.failovers_total) + (inProgress.length ? ` (+${inProgress.length} in progress)` : ""), inProgress.length ? "warn" : ""),
    card("rebalances", follower && !c.rebalances_total ? "–" : c.rebalances_total));
  // Tables are redrawn only when what they show changed, so that a button
  // is not replaced under the pointer.
  if (changed("members", [c.node, c.leader, elsewhere, c.members, [...owned], [...subtasks], state.busy])) tbodyRows("#members", c.members.map((m) => {
    const drain = el("button", { class: "drain", "data-node": m.id, title: `move all of ${m.id}'s work away, then let it leave` }, "Drain");
    drain.disabled = state.busy || m.state !== "alive";
    drain.addEventListener("click", () => clusterAct(`/cluster/drain/${encodeURIComponent(m.id)}`, `Drain ${m.id}`,
      `Drain node ${m.id}? Its subtasks move to the other members by savepoint migration (only the moved key groups pause), then it leaves the cluster.`));
    // A drained member gets its Undrain button in place of Drain.
    let action = drain;
    if (m.drained) {
      action = el("button", { class: "undrain", "data-node": m.id, title: `let ${m.id} rejoin and take work again` }, "Undrain");
      action.disabled = state.busy;
      action.addEventListener("click", () => clusterAct(`/cluster/undrain/${encodeURIComponent(m.id)}`, `Undrain ${m.id}`,
        `Undrain node ${m.id}? It rejoins the cluster and takes subtasks again at the join's rebalance.`));
    }
    return el("tr", { "data-node": m.id },
      el("td", {}, nodeChip(m.id), m.id === c.node ? el("span", { class: "tag" }, "this node") : ""),
      el("td", {}, el("span", { class: "state state-" + m.state }, m.state),
        // Drained: its subtasks move away (still alive) or have (left),
        // as edged cluster status prints "(drained)".
        m.drained ? el("span", { class: "tag drained", title: "drained: it takes no subtasks until it is undrained or restarts" }, "drained") : "",
        m.other_pipelines ? el("span", { class: "tag warn", title: "its config or version differs from the job masters': it gets no subtasks until it restarts with the same pipelines" }, "other pipelines") : ""),
      el("td", {}, m.leader ? "★ leader" : ""),
      m.id === c.node ? el("td", { class: m.sees_majority ? "ok" : "bad" }, m.sees_majority ? "yes" : "no")
        : el("td", { class: "muted", title: "known for this node only: see that node's dashboard" }, "—"),
      el("td", { class: "num" }, m.capacity || "no limit"),
      el("td", { class: "num" }, m.weight || 1),
      el("td", { class: "num" }, count(subtasks.get(m.id) || 0)),
      el("td", { class: "num kg-count" }, count(owned.get(m.id) || 0)),
      el("td", {}, el("code", {}, m.address)), el("td", {}, el("code", {}, m.api)),
      el("td", {}, action));
  }), "no members");
  $("#btn-rebalance").disabled = state.busy || !c.leader;
  if (changed("kg", [c.epoch, c.leader, c.max_parallelism, c.members, c.placement, svgWidth("#kg-map")])) drawKeyGroups(c, owned, elsewhere);
  if (!changed("tables", [c.leader, c.members, c.replicas, c.failovers, inProgress, c.rebalances])) return;
  const recordedBy = () => follower ? el("span", {}, "none recorded by this node: the leader, ", leaderRef(c.leader, "cluster"), ", records them") : null;
  const rep = [];
  for (const cp of c.replicas) for (const f of cp.files) {
    rep.push(el("tr", {}, el("td", {}, (cp.job ? cp.job + " " : "") + "#" + cp.checkpoint), el("td", {}, el("code", {}, f.file)),
      el("td", { class: "num" }, fmtBytes(f.size)),
      el("td", { class: f.nodes.length < 2 ? "warn" : "" }, ...f.nodes.map(nodeChip), f.nodes.length < 2 ? " one copy only" : "")));
  }
  tbodyRows("#replicas", rep.slice(0, 40), "no replicated checkpoint yet");
  const fo = c.failovers.slice(0, 10);
  const maxTotal = Math.max(1, ...fo.map(foTotal));
  const pending = inProgress.map((f) => el("tr", { class: "in-progress" },
    el("td", {}, fmtDateTime(f.at)), el("td", {}, nodeChip(f.dead_node)),
    el("td", { class: "warn", colspan: "7" }, `in progress (detection ${fmtMs(f.detection_ms)}): the jobs do not run again on a new placement yet`)));
  tbodyRows("#failovers", pending.concat(fo.map((f) => el("tr", {},
    el("td", {}, fmtDateTime(f.at)), el("td", {}, nodeChip(f.dead_node)), el("td", { class: "num" }, f.epoch),
    el("td", { class: "num" }, fmtMs(f.detection_ms)), el("td", { class: "num" }, fmtMs(f.placement_ms)),
    el("td", { class: "num" }, fmtMs(f.restore_ms)), el("td", { class: "num" }, fmtMs(f.first_record_ms)),
    el("td", { class: "num" }, el("b", {}, fmtMs(foTotal(f)))), el("td", {}, phaseBar(f, maxTotal))))), recordedBy() || "no failover since this node started");
  tbodyRows("#rebalances", c.rebalances.slice(0, 10).map((r) => {
    const pauses = Object.entries(r.pause_ms || {}).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
    const moved = r.outcome !== "refused" && r.outcome !== "aborted";
    return el("tr", {},
      el("td", {}, fmtDateTime(r.at)), el("td", {}, r.trigger),
      el("td", { class: "state " + (r.outcome === "done" ? "ok" : r.outcome === "running" ? "" : "bad") }, r.outcome),
      el("td", { class: "num" }, moved ? r.moved_key_groups : "–"), el("td", { class: "num" }, moved ? fmtBytes(r.bytes_shipped) : "–"),
      el("td", { class: "pauses" }, pauses.length ? pauses.slice(0, 6).map(([s, ms]) => `${s} ${fmtMs(ms)}`).join(", ") + (pauses.length > 6 ? ` … (${pauses.length})` : "") : "–"),
      el("td", { class: "err" }, r.error || ""));
  }), recordedBy() || "no rebalance since this node started");
}

// changed reports whether the data drawn under name differs from the
// last time it was drawn.
const drawn = new Map();
function changed(name, data) {
  const k = JSON.stringify(data);
  if (drawn.get(name) === k) return false;
  drawn.set(name, k);
  return true;
}

function svgWidth(sel) { return $(sel).parentElement.clientWidth; }

function foTotal(f) { return f.detection_ms + f.placement_ms + f.restore_ms + f.first_record_ms; }

function fmtDateTime(iso) {
  const d = new Date(iso);
  return isNaN(d) ? "" : d.toLocaleDateString() + " " + d.toLocaleTimeString();
}

// phaseBar draws a failover's phases as one bar, scaled to the longest
// failover shown.
function phaseBar(f, maxTotal) {
  const W = 180, H = 12;
  const svg = sv("svg", { width: W, height: H, class: "phases" });
  let x = 0;
  for (const [k, v] of [["detection", f.detection_ms], ["placement", f.placement_ms], ["restore", f.restore_ms], ["first", f.first_record_ms]]) {
    const w = (v / maxTotal) * W;
    const r = sv("rect", { x, y: 0, width: Math.max(w, v > 0 ? 1 : 0), height: H, class: "ph-" + k });
    r.append(sv("title", {}, `${k}: ${fmtMs(v)}`));
    svg.append(r);
    x += w;
  }
  return svg;
}

// drawKeyGroups draws one row per keyed operator over its key groups
// 0..max-1, each subtask's range coloured by the node that owns it, and
// key groups nobody owns hatched.
function drawKeyGroups(c, owned, elsewhere) {
  const svg = $("#kg-map");
  svg.replaceChildren();
  const ops = new Map();
  let maxKG = c.max_parallelism || 0;
  for (const p of c.placement) for (const s of p.subtasks) {
    const key = (s.job ? s.job + "/" : "") + s.operator + (s.uid && s.uid !== s.operator ? ` (${s.uid})` : "");
    if (!ops.has(key)) ops.set(key, []);
    ops.get(key).push({ ...s, node: p.node });
    if (!c.max_parallelism) maxKG = Math.max(maxKG, s.key_groups[1] + 1);
  }
  $("#kg-note").textContent = `which node owns which key groups of each keyed operator, epoch ${c.epoch}` + (maxKG ? `; ${maxKG} key groups` : "");
  if (!ops.size) {
    svg.setAttribute("width", elsewhere ? 640 : 460); svg.setAttribute("height", 40); svg.removeAttribute("viewBox");
    svg.append(sv("text", { x: 10, y: 25, class: "tick" }, elsewhere ? `the placement is kept by the leader, node ${c.leader}, which runs the job masters` : "no keyed subtask placed under this epoch"));
    $("#kg-legend").replaceChildren(...(elsewhere ? [el("span", { class: "legend-item" }, "see the leader's cluster view: ", leaderRef(c.leader, "cluster"))] : []));
    return;
  }
  const L = 190, R = 16, T = 22, ROW = 34, BAR = 24;
  const W = Math.max(640, (svg.parentElement.clientWidth || 900) - 30);
  const H = T + ops.size * ROW + 6;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`); svg.setAttribute("width", W); svg.setAttribute("height", H);
  const pw = W - L - R, x = (g) => L + (g / maxKG) * pw;
  const defs = sv("defs");
  const pat = sv("pattern", { id: "unowned", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
  pat.append(sv("rect", { width: 6, height: 6, class: "kg-gap-bg" }), sv("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "kg-gap-line" }));
  defs.append(pat); svg.append(defs);
  const step = maxKG <= 16 ? 4 : maxKG <= 64 ? 16 : 32;
  for (let g = 0; g <= maxKG; g += step) {
    svg.append(sv("line", { x1: x(g), y1: T - 4, x2: x(g), y2: H - 4, class: "axis" }));
    svg.append(sv("text", { x: x(g), y: T - 8, "text-anchor": "middle", class: "tick" }, g));
  }
  [...ops.keys()].sort().forEach((op, i) => {
    const y = T + i * ROW + (ROW - BAR) / 2;
    svg.append(sv("text", { x: L - 10, y: y + BAR / 2 + 4, "text-anchor": "end", class: "op" }, op.length > 28 ? op.slice(0, 27) + "…" : op));
    const subs = ops.get(op).sort((a, b) => a.key_groups[0] - b.key_groups[0]);
    svg.append(sv("rect", { x: L, y, width: pw, height: BAR, class: "kg-gap", fill: "url(#unowned)" }));
    for (const s of subs) {
      const [a, b] = s.key_groups;
      const r = sv("rect", { x: x(a) + 0.5, y, width: Math.max(1, x(b + 1) - x(a) - 1), height: BAR, rx: 3, class: "kg",
        fill: nodeColor(s.node), "data-node": s.node, "data-operator": s.operator, "data-subtask": s.subtask, "data-first": a, "data-last": b });
      r.append(sv("title", {}, `${op} subtask ${s.subtask}: key groups ${a}–${b} on ${s.node}`));
      svg.append(r);
      const label = `${s.node} #${s.subtask}`;
      if (x(b + 1) - x(a) > label.length * 6.5 + 8) svg.append(sv("text", { x: (x(a) + x(b + 1)) / 2, y: y + BAR / 2 + 4, "text-anchor": "middle", class: "kg-label" }, label));
    }
  });
  $("#kg-legend").replaceChildren(...c.members.map((m) => el("span", { class: "legend-item" + (m.state === "alive" ? "" : " off") },
    nodeChip(m.id), ` ${owned.get(m.id) || 0} key groups` + (m.state === "alive" ? "" : ` (${m.state})`))),
  el("span", { class: "legend-item" }, el("span", { class: "swatch unowned" }), " unowned"));
}

async function clusterAct(path, title, text) {
  if (!(await confirmDialog(title, text))) return;
  const st = $("#cluster-status");
  state.busy = true;
  st.className = "action-status";
  st.textContent = `${title}…`;
  try {
    const r = await api(path, { method: "POST" });
    const rb = r.rebalance;
    st.textContent = `${title}: done` + (rb ? ` (${rb.outcome}; ${rb.moved_key_groups} key groups moved, ${fmtBytes(rb.bytes_shipped)} shipped)` : "");
  } catch (e) {
    st.className = "action-status bad";
    st.textContent = `${title} failed: ${e.message}`;
  } finally {
    state.busy = false;
    tick();
  }
}

// ---- actions -------------------------------------------------------------

function confirmDialog(title, text) {
  const d = $("#confirm");
  $("#confirm-title").textContent = title;
  $("#confirm-text").textContent = text;
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "ok"), { once: true });
    d.showModal();
  });
}

async function act(op, title, text) {
  const job = state.job;
  if (!job || !(await confirmDialog(title, text.replace("%s", job)))) return;
  const st = $("#action-status");
  state.busy = true;
  st.className = "action-status";
  st.textContent = `${title}…`;
  try {
    const r = await api(`/jobs/${encodeURIComponent(job)}/${op}`, { method: "POST" });
    st.textContent = r.path ? `savepoint written to ${r.path}` : `job ${r.status}`;
  } catch (e) {
    st.className = "action-status bad";
    st.textContent = `${title} failed: ${e.message}`;
  } finally {
    state.busy = false;
    tick();
  }
}

// ---- loop ----------------------------------------------------------------

let ticking = false;
async function tick() {
  if (ticking) return;
  ticking = true;
  try {
    await refreshJobs();
    renderCards();
    if (state.worker) {
      renderWorkerViews();
    } else if (state.job) {
      if (state.view === "job") {
        await refreshTasks();
        await refreshGraph();
        await refreshDeadLetters();
      } else if (state.view === "checkpoints") {
        await refreshCheckpoints();
      }
    }
    if (state.view === "ingest") await refreshIngest();
    if (state.view === "cluster") await refreshCluster(); else await refreshClusterNav();
    $("#conn").className = "conn live";
    $("#conn").textContent = "live";
    if (!$("#banner").textContent.startsWith("This node requires")) banner("");
  } catch (e) {
    $("#conn").className = "conn down";
    $("#conn").textContent = "disconnected";
    if (!$("#banner").textContent.startsWith("This node requires")) banner(`Cannot reach the node: ${e.message}`);
  } finally {
    ticking = false;
  }
}

$("#job-select").addEventListener("change", (e) => { state.job = e.target.value; state.graphKey = ""; tick(); });
$("#btn-savepoint").addEventListener("click", () => act("savepoint", "Trigger savepoint", "Take a savepoint of job %s now? The job keeps running."));
$("#btn-stop").addEventListener("click", () => act("stop", "Stop with savepoint", "Take a savepoint of job %s and stop it? It does not restart until the node runs it again."));
$("#btn-rebalance").addEventListener("click", () => clusterAct("/cluster/rebalance", "Rebalance",
  "Rebalance the cluster now? The leader computes the placement for the live members and moves the subtasks whose node changes by savepoint migration; only their key groups pause."));
$("#btn-cancel").addEventListener("click", () => act("cancel", "Cancel job", "Cancel job %s without a savepoint? It resumes from its latest checkpoint when the node runs it again."));
window.addEventListener("hashchange", () => showView(location.hash.slice(1)));
showView(location.hash.slice(1));
setInterval(tick, POLL_MS);
