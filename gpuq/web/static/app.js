// The gpuq dashboard: plain DOM, no framework, no build step. Every bit of server text goes
// in through textContent or attributes (job names and reasons are users' text), never as HTML.
// Every moment is written by dates.js's `when`, the dashboard's one date format.

import { when } from "/static/dates.js";

window.__loadId = `${Date.now()}-${Math.random()}`;

const main = document.getElementById("main");
const statusLine = document.getElementById("status");
const liveBadge = document.getElementById("live");
const GIB = 1024 ** 3;
const LIVE = new Set(["pending", "held", "running"]);

let me = null; // {user, admin}
let view = null; // {load: async () => void, poll?: seconds}
let firstRender = true;

class Unauthorized extends Error {}
class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// ---- helpers ---------------------------------------------------------------------------

// A job's nodes as SLURM compresses them (gpu[01-02]): gpuq.domain.node_constraints.compress_nodes
function nodeText(job) {
  const names = job.nodes && job.nodes.length ? job.nodes : job.node ? [job.node] : [];
  const groups = [];
  for (const name of names) {
    const m = /^(.*?[^0-9])?([0-9]{1,9})$/.exec(name);
    const last = groups[groups.length - 1];
    if (!m) groups.push([name, []]);
    else if (last && last[0] === (m[1] || "") && last[1].length) last[1].push(m[2]);
    else groups.push([m[1] || "", [m[2]]]);
  }
  return groups
    .map(([prefix, numbers]) => {
      if (numbers.length < 2) return prefix + (numbers[0] || "");
      const runs = [];
      for (const n of numbers) {
        const run = runs[runs.length - 1];
        const prev = run && run[run.length - 1];
        const padded = prev !== undefined && (prev.startsWith("0") || n.startsWith("0"));
        if (prev !== undefined && Number(n) === Number(prev) + 1 && (!padded || prev.length === n.length)) run.push(n);
        else runs.push([n]);
      }
      return `${prefix}[${runs.map((r) => (r.length === 1 ? r[0] : `${r[0]}-${r[r.length - 1]}`)).join(",")}]`;
    })
    .join(",");
}

function totalGpus(res) {
  return (res.gpus || 0) * (res.nodes || 1);
}

function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function api(path, options = {}) {
  const init = { credentials: "same-origin", headers: { Accept: "application/json" }, ...options };
  if (options.method === "POST") {
    init.headers = { ...init.headers, "Content-Type": "application/json", "X-Gpuq": "1" };
  }
  const reply = await fetch(path, init);
  if (reply.status === 401) throw new Unauthorized();
  const text = await reply.text();
  let body = null;
  try {
    body = text ? JSON.parse(text) : {};
  } catch {
    body = null;
  }
  if (!reply.ok) {
    const said = body && (body.error || body.message || body.detail);
    throw new ApiError(reply.status, said || text.trim() || `${reply.status} ${reply.statusText}`);
  }
  if (body === null) throw new ApiError(reply.status, "the server's reply is not JSON");
  return body;
}

function say(message) {
  statusLine.textContent = message;
}

const num = (value) => (value === undefined || value === null ? 0 : Number(value));

function gib(bytes) {
  const g = num(bytes) / GIB;
  return g >= 10 || g === 0 ? g.toFixed(0) : g.toFixed(1);
}

function span(seconds) {
  let s = Math.max(0, Math.round(seconds));
  const days = Math.floor(s / 86400);
  s -= days * 86400;
  const hh = String(Math.floor(s / 3600)).padStart(2, "0");
  const mm = String(Math.floor((s % 3600) / 60)).padStart(2, "0");
  const ss = String(s % 60).padStart(2, "0");
  return `${days ? `${days}-` : ""}${hh}:${mm}:${ss}`;
}

const now = () => Date.now() / 1000;

function jobLabel(job) {
  if (job.array_tasks) return `${job.id}_[${job.array_tasks}]`;
  if (job.array_job_id !== undefined && job.array_task_id !== undefined) {
    return `${job.array_job_id}_${job.array_task_id}`;
  }
  return String(job.id);
}

const jobLink = (job) => h("a", { href: `/jobs/${job.id}`, "data-job-link": job.id }, jobLabel(job));
const userLink = (user) => h("a", { href: `/users/${encodeURIComponent(user)}` }, user);
const stateBadge = (state) => h("span", { class: `state state-${state}`, "data-state": state }, state);

// a table scrolls inside its box on a narrow screen, never the page
function table(caption, headers, rows, props = {}) {
  return h(
    "div",
    { class: "table-box" },
    h(
      "table",
      props,
      h("caption", { class: "sr" }, caption),
      h("thead", {}, h("tr", {}, headers.map((name) => h("th", { scope: "col" }, name)))),
      h("tbody", {}, rows),
    ),
  );
}

function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.filter(([, value]) => value !== undefined && value !== null && value !== "")
      .map(([name, value]) => h("div", {}, h("dt", {}, name), h("dd", {}, value))),
  );
}

function resultText(job) {
  const r = job.result;
  if (!r) return "";
  const parts = [];
  if (r.exit_code !== undefined) parts.push(`exit ${r.exit_code}`);
  if (r.signal !== undefined) parts.push(`signal ${r.signal}`);
  if (r.reason) parts.push(r.reason);
  return parts.join(", ");
}

function pendingText(job) {
  const parts = [];
  if (job.pending && job.pending.reasons) parts.push(job.pending.reasons.join("; "));
  else if (job.reason) parts.push(job.reason);
  if (job.pending && job.pending.estimated_start) {
    parts.push(`est. start ${when(job.pending.estimated_start)}`);
  }
  return parts.join(" · ");
}

// ---- the cluster view ------------------------------------------------------------------

function gpuCard(node, unit, usage, health, holders, jobsById) {
  const used = num(usage && usage.memory_used);
  const total = num(unit.memory);
  const state = (health && health.health) || (usage && usage.health) || "ok";
  const why = (health && health.reason) || (usage && usage.health_reason) || "";
  const bar = h("div", { class: "fill" });
  bar.style.width = `${total ? Math.min(100, (used / total) * 100).toFixed(1) : 0}%`;
  const util = usage && typeof usage.utilization === "number" ? `${usage.utilization} %` : "—";
  const holder = holders.length
    ? h(
        "p",
        { class: "holder" },
        holders.map((id, i) => {
          const job = jobsById.get(String(id));
          return [
            i ? ", " : "job ",
            h("a", { href: `/jobs/${id}`, "data-job-link": id }, job ? jobLabel(job) : String(id)),
            job ? [" · ", userLink(job.user)] : "",
          ];
        }),
      )
    : h("p", { class: "holder free" }, node.state === "up" && state === "ok" ? "free" : "not available");
  return h(
    "article",
    {
      class: `gpu health-${state}${holders.length ? " busy" : ""}`,
      "data-gpu-uuid": unit.uuid,
      "data-health": state,
      "data-holder": holders.join(",") || undefined,
    },
    h(
      "h3",
      {},
      `GPU ${unit.index ?? 0}`,
      unit.mig_profile ? ` · ${unit.mig_profile}` : "",
      h("span", { class: "model" }, unit.name || ""),
    ),
    h("span", { class: `badge health-${state}`, title: why || undefined }, state),
    h(
      "div",
      { class: "meter", role: "img", "aria-label": `memory ${gib(used)} of ${gib(total)} GiB` },
      bar,
    ),
    h("p", { class: "figures" }, h("span", {}, `${gib(used)} / ${gib(total)} GiB`), h("span", {}, `util ${util}`)),
    holder,
  );
}

// A running job's progress from its own output (Job.progress: only its owner and admins get
// it), as `gpuq queue --long` shows it: "12% 3.2it/s ETA 00:04:33"
function progressText(job) {
  const p = job.progress;
  if (!p) return "";
  const unit = p.unit || "units";
  const parts = [p.fraction !== undefined ? `${(p.fraction * 100).toFixed(0)}%` : `${num(p.done)} ${unit}`];
  if (p.rate !== undefined) parts.push(`${p.rate < 10 ? p.rate.toPrecision(2) : Math.round(p.rate)} ${unit}/s`);
  if (p.eta !== undefined) parts.push(`ETA ${span(p.eta)}`);
  return parts.join(" ") + (p.collapse ? ` (${p.collapse})` : "");
}

const progressNote = (job) =>
  job.progress ? h("span", { class: "muted", "data-progress": job.id }, ` · ${progressText(job)}`) : "";

function queueRow(job) {
  const running = job.state === "running";
  const time = running && job.start_time
    ? span(now() - job.start_time)
    : `submitted ${when(job.submit_time)}`;
  const resources = (job.spec && job.spec.resources) || {};
  return h(
    "tr",
    { "data-job-id": job.id, "data-state": job.state },
    h("td", {}, jobLink(job)),
    h("td", {}, userLink(job.user)),
    h("td", { class: "name" }, (job.spec && job.spec.name) || ""),
    h("td", {}, stateBadge(job.state)),
    h("td", { class: "num" }, String(totalGpus(resources))),
    h("td", { class: "num" }, time),
    h("td", { class: "reason" }, running ? [nodeText(job), progressNote(job)] : pendingText(job)),
  );
}

function finishedRow(job) {
  const elapsed = job.start_time && job.end_time ? span(job.end_time - job.start_time) : "";
  return h(
    "tr",
    { "data-job-id": job.id, "data-state": job.state },
    h("td", {}, jobLink(job)),
    h("td", {}, userLink(job.user)),
    h("td", { class: "name" }, (job.spec && job.spec.name) || ""),
    h("td", {}, stateBadge(job.state)),
    h("td", { class: "num" }, when(job.end_time)),
    h("td", { class: "num" }, elapsed),
    h("td", { class: "reason" }, resultText(job)),
  );
}

async function clusterView() {
  // the queue is a page (its first 250 entries, at most [coordinator] list_page_size): the
  // GPUs' holders come from the running jobs' own listing, the summary from counts of every
  // live job
  const [nodes, live, running, finished] = await Promise.all([
    api("/api/nodes"),
    api("/api/jobs?page_size=250"),
    api("/api/jobs?state=running"),
    api("/api/jobs?finished=1&limit=20"),
  ]);
  const jobs = live.jobs || [];
  const holders = running.jobs || [];
  const jobsById = new Map([...jobs, ...holders].map((job) => [String(job.id), job]));
  // who holds a GPU: the jobs it is allocated to, and any job its agent saw using it
  const holding = new Map();
  const hold = (uuid, id) => {
    const ids = holding.get(uuid) || new Set();
    ids.add(String(id));
    holding.set(uuid, ids);
  };
  for (const job of holders) for (const uuid of job.gpus || []) hold(uuid, job.id);
  let total = 0;
  let busy = 0;
  let free = 0;
  const sections = (nodes.nodes || []).map((node) => {
    const usage = new Map((node.usage || []).map((u) => [u.uuid, u]));
    const health = new Map((node.health || []).map((u) => [u.uuid, u]));
    const units = node.gpus || [];
    const cards = units.map((unit) => {
      total += 1;
      const u = usage.get(unit.uuid);
      const hl = health.get(unit.uuid);
      for (const id of (u && u.job_ids) || []) hold(unit.uuid, id);
      const holders = [...(holding.get(unit.uuid) || [])];
      if (holders.length || (node.gpus_used || []).includes(unit.uuid)) busy += 1;
      else if (node.state === "up" && (!hl || hl.health === "ok")) free += 1;
      return gpuCard(node, unit, u, hl, holders, jobsById);
    });
    const why = node.drain_reason ? `drained: ${node.drain_reason}` : node.reason || node.gpu_problem || "";
    return h(
      "section",
      { class: "node", "data-node": node.name, "aria-labelledby": `node-${node.name}` },
      h(
        "h2",
        { id: `node-${node.name}` },
        node.name,
        " ",
        h("span", { class: `state node-${node.state}`, "data-node-state": node.state }, node.state),
        why ? h("span", { class: "why" }, why) : "",
      ),
      cards.length ? h("div", { class: "cards" }, cards) : h("p", { class: "muted" }, "no GPUs"),
    );
  });
  const counts = live.counts || {};
  const count = (state) => counts[state] ?? jobs.filter((job) => job.state === state).length;
  const summary = h(
    "p",
    { class: "summary", id: "summary" },
    `${total} GPUs: ${busy} allocated, ${free} free · ${count("running")} running, `,
    `${count("pending")} pending, ${count("held")} held`,
  );
  const ended = finished.jobs || [];
  render(
    h("h1", {}, "Cluster"),
    summary,
    sections.length ? sections : h("p", { class: "muted" }, "No nodes have registered."),
    h("h2", {}, "Queue", h("a", { href: "/queue", class: "why" }, "in priority order, with filters")),
    jobs.length
      ? table("Live jobs", ["Job", "User", "Name", "State", "GPUs", "Time", "Reason / node"], jobs.map(queueRow), { id: "queue" })
      : h("p", { class: "muted", id: "queue-empty" }, "No jobs are waiting or running."),
    live.next_page_token
      ? h("p", { class: "muted", id: "queue-more" }, `The first ${jobs.length} entries of the queue: gpuq queue lists them all.`)
      : "",
    h("h2", {}, "Recently finished"),
    ended.length
      ? table("Finished jobs", ["Job", "User", "Name", "State", "Ended", "Elapsed", "Result"], ended.map(finishedRow), { id: "finished" })
      : h("p", { class: "muted" }, "None yet."),
  );
  if (!performance.getEntriesByName("gpuq-cards").length) performance.mark("gpuq-cards");
}

// ---- the job view ----------------------------------------------------------------------

async function act(verb, job) {
  try {
    const reply = await api(`/api/jobs/${job.id}/${verb}`, { method: "POST", body: "{}" });
    const lines = (reply.outcomes || []).map((o) => `${o.job_id}: ${o.message || (o.done ? "done" : "not done")}`);
    say(lines.join("; ") || `${verb}: no reply`);
  } catch (error) {
    if (error instanceof Unauthorized) return loginView();
    say(`${verb} failed: ${error.message}`);
  }
  refresh();
}

function actions(job) {
  if (!me || !(me.admin || me.user === job.user) || !LIVE.has(job.state)) return null;
  const buttons = [h("button", { type: "button", "data-action": "cancel", onclick: () => act("cancel", job) }, "Cancel")];
  if (job.state === "pending") {
    buttons.push(h("button", { type: "button", "data-action": "hold", onclick: () => act("hold", job) }, "Hold"));
  }
  if (job.state === "held") {
    buttons.push(h("button", { type: "button", "data-action": "release", onclick: () => act("release", job) }, "Release"));
  }
  return h("div", { class: "actions" }, buttons);
}

async function optional(path) {
  try {
    return await api(path);
  } catch (error) {
    if (error instanceof Unauthorized) throw error;
    return { error: error.message };
  }
}

// why it ended as it did (gpuq diagnose): the verdict with its evidence and next step, then
// the others; nothing when there is nothing to say
function diagnosisSection(diagnosis) {
  const verdicts = (diagnosis && diagnosis.verdicts) || [];
  if (!verdicts.length || (verdicts.length === 1 && verdicts[0].name === "completed")) return [];
  const [first, ...others] = verdicts;
  return [
    h("h2", {}, "Diagnosis"),
    h(
      "div",
      { id: "diagnosis" },
      h("p", {}, h("strong", {}, first.title), " ", h("span", { class: "muted" }, `[${first.name}]`)),
      h("ul", {}, ...(first.evidence || []).map((line) => h("li", { class: "reason" }, line))),
      first.advice ? h("p", {}, "Next step: ", first.advice) : "",
      others.length ? h("p", { class: "muted" }, "Also: ", others.map((v) => `${v.title} [${v.name}]`).join("; ")) : "",
      diagnosis.note ? h("p", { class: "muted" }, diagnosis.note) : "",
    ),
  ];
}

async function jobView(id) {
  const asked = api(`/api/jobs/${id}`);
  // no output before its first start (and no console error for a 404 to say so)
  const tail = asked.then((d) =>
    d.job.start_time || d.job.start_count ? optional(`/api/jobs/${id}/log`) : { error: "No output yet: the job has not started." },
  );
  // a job without GPUs has no GPU figures to chart: neither the chart nor its points
  const withGpus = asked.then((d) => totalGpus((d.job.spec || {}).resources || {}) > 0);
  const [charts, detail, series, log, nodes] = await Promise.all([
    withGpus.then((yes) => (yes ? import("/static/chart.js") : null)), // only here a chart
    asked,
    withGpus.then((yes) => (yes ? optional(`/api/jobs/${id}/series`) : null)),
    tail,
    optional("/api/nodes"),
  ]);
  const job = detail.job;
  const spec = job.spec || {};
  const res = spec.resources || {};
  const held = new Set(job.gpus || []);
  let gpuMem = 0;
  for (const node of nodes.nodes || []) {
    for (const unit of node.gpus || []) if (held.has(unit.uuid)) gpuMem += num(unit.memory);
  }
  const end = job.end_time || (job.state === "running" ? now() : 0);
  const elapsed = job.start_time && end ? span(end - job.start_time) : "";
  const t = job.telemetry;
  const efficiency = t
    ? facts([
        ["GPU utilisation", t.util_mean !== undefined ? `${t.util_mean.toFixed(0)} % mean${t.util_p95 !== undefined ? `, ${t.util_p95.toFixed(0)} % p95` : ""}` : "unknown"],
        ["GPU memory", `${gib(t.peak_gpu_mem)} GiB peak${gpuMem ? ` of ${gib(gpuMem)} GiB` : ""}`],
        ["Energy", t.energy !== undefined ? `${(t.energy / 3600).toFixed(1)} Wh` : ""],
        ["Samples", `${t.samples || 0} over ${span(t.seconds || 0)}`],
      ])
    : h("p", { class: "muted" }, "No GPU figures (yet).");
  const points = (series && series.points) || [];
  const gpuFigures = charts
    ? [
        efficiency,
        h("figure", { class: "chart-box" }, charts.seriesChart(points, gpuMem), h("figcaption", { class: "muted" }, series.error ? series.error : `${points.length} sample${points.length === 1 ? "" : "s"}${job.state === "running" ? " (the latest every few seconds)" : ""}`)),
      ]
    : h("p", { class: "muted", id: "no-gpus" }, "This job has no GPUs: no GPU figures.");
  const events = detail.events || [];
  const logBody = log.error || log.missing
    ? h("p", { class: "muted", id: "log-error" }, log.error || log.missing)
    : [
        h("p", { class: "muted" }, log.path || "", log.truncated ? ` (last ${log.text.length} characters of ${log.size} bytes)` : ""),
        h("pre", { id: "log", tabindex: "0" }, log.text || ""),
      ];
  render(
    h("h1", {}, `Job ${jobLabel(job)} `, h("span", { class: "name" }, spec.name || ""), " ", stateBadge(job.state)),
    actions(job),
    facts([
      ["User", userLink(job.user)],
      ["State", job.state + (job.reason && job.reason !== job.state ? ` (${job.reason})` : "")],
      ["Waiting for", job.state === "pending" ? pendingText(job) : ""],
      ["Result", resultText(job)],
      ["Submitted", when(job.submit_time)],
      ["Started", when(job.start_time)],
      ["Ended", when(job.end_time)],
      ["Elapsed", elapsed],
      ["Progress", progressText(job)],
      ["QOS", job.qos || spec.qos],
      ["Flags", (job.flags || []).join("; ")],
    ]),
    ...diagnosisSection(detail.diagnosis),
    h("h2", {}, "Resources"),
    facts([
      ["GPUs", String(totalGpus(res)) + ((res.nodes || 1) > 1 ? ` (${res.gpus || 0} per node)` : "") + (res.gpu_type ? ` × ${res.gpu_type}` : "") + (res.mig ? ` (MIG ${res.mig})` : "") + (res.gpu_share ? ` (${res.gpu_share} % share)` : "")],
      ["GPU memory", res.gpu_mem ? `≥ ${gib(res.gpu_mem)} GiB per GPU` : ""],
      ["CPUs", String(res.cpus || 0)],
      ["Memory", res.mem ? `${gib(res.mem)} GiB` : ""],
      ["Time limit", res.time_limit ? span(num(res.time_limit)) : "QOS default"],
      [(job.nodes || []).length > 1 ? "Nodes" : "Node", nodeText(job)],
      ["Tasks", (res.nodes || 1) > 1 || (res.tasks_per_node || 1) > 1 ? `${(res.nodes || 1) * (res.tasks_per_node || 1)} (${res.tasks_per_node || 1} per node)` : ""],
      ["GPUs held", (job.gpus || []).join(", ")],
      ["Enforcement", job.gpu_enforcement],
    ]),
    h("h2", {}, "Efficiency"),
    gpuFigures,
    h("h2", {}, "State history"),
    table(
      "State history",
      ["Time", "From", "To", "Reason", "Cause"],
      events.map((e) => h("tr", {}, h("td", { class: "num" }, when(e.at)), h("td", {}, e.from_state || "—"), h("td", {}, stateBadge(e.to_state)), h("td", { class: "reason" }, e.reason || ""), h("td", { class: "muted" }, e.cause || ""))),
      { id: "events" },
    ),
    h("h2", {}, "Log"),
    logBody,
  );
  view.poll = job.state === "running" ? 5 : 0;
}

// ---- the user view ---------------------------------------------------------------------

async function userView(name) {
  const data = await api(`/api/users/${encodeURIComponent(name)}`);
  const report = data.report || {};
  // null where [coordinator] private_data hides another user's usage
  const fair = data.fairshare || { usage: "private", factor: "private" };
  const jobs = data.jobs || [];
  const fairText = (key) => (typeof fair[key] === "number" ? fair[key].toFixed(3) : fair[key]);
  render(
    h("h1", {}, `User ${data.user || name}`),
    facts([
      ["GPU-hours", (num(report.gpu_seconds) / 3600).toFixed(1)],
      ["Jobs ended", String(num(report.jobs))],
      ["Energy", report.energy !== undefined ? `${(report.energy / 3.6e6).toFixed(2)} kWh` : ""],
      ["Mean GPU utilisation", report.util_mean !== undefined ? `${report.util_mean.toFixed(0)} %` : "unknown"],
      ["Fair-share usage", fairText("usage")],
      ["Fair-share factor", fairText("factor")],
      ["Running GPUs", data.running_gpus === null ? "private" : String(num(data.running_gpus))],
    ]),
    h("h2", {}, "Live jobs"),
    jobs.length
      ? table("Live jobs", ["Job", "User", "Name", "State", "GPUs", "Time", "Reason / node"], jobs.map(queueRow), { id: "queue" })
      : h("p", { class: "muted" }, "No jobs are waiting or running."),
    data.more ? h("p", { class: "muted", id: "queue-more" }, `The first ${jobs.length} entries: gpuq queue -u ${data.user || name} lists them all.`) : "",
  );
}

// ---- the queue, in priority order ------------------------------------------------------

const QUEUE_FILTERS = ["user", "state", "partition", "name"];

function rankedRow(job, rank) {
  const res = (job.spec && job.spec.resources) || {};
  const partitions = (job.spec && job.spec.placement && job.spec.placement.partitions) || [];
  const running = job.state === "running";
  const priority = job.pending && typeof job.pending.priority === "number" ? job.pending.priority.toFixed(0) : "";
  return h(
    "tr",
    { "data-job-id": job.id, "data-state": job.state },
    h("td", { class: "num" }, rank ? String(rank) : ""),
    h("td", {}, jobLink(job)),
    h("td", {}, userLink(job.user)),
    h("td", { class: "name" }, (job.spec && job.spec.name) || ""),
    h("td", {}, stateBadge(job.state)),
    h("td", { class: "num" }, priority),
    h("td", { class: "num" }, String(totalGpus(res))),
    h("td", {}, partitions.join(",")),
    h("td", { class: "num" }, when(job.submit_time)),
    h("td", { class: "reason" }, running ? nodeText(job) : pendingText(job)),
  );
}

function queueForm(params, partitions) {
  const field = (label, input) => h("label", { class: "field" }, h("span", {}, label), input);
  const choice = (name, options) =>
    h("select", { name, onchange: (e) => e.target.form.requestSubmit() }, options.map(([value, text]) => h("option", { value, selected: params.get(name) === value }, text)));
  return h(
    "form",
    {
      id: "queue-form",
      class: "filters",
      role: "search",
      onsubmit: (event) => {
        event.preventDefault();
        const wanted = new URLSearchParams();
        for (const [key, value] of new FormData(event.target)) if (value) wanted.set(key, value);
        history.replaceState(null, "", `/queue${wanted.toString() ? `?${wanted}` : ""}`);
        refresh();
      },
    },
    field("User", h("input", { name: "user", value: params.get("user") || "", autocomplete: "off", size: 10 })),
    field("State", choice("state", [["", "any"], ["pending", "pending"], ["held", "held"], ["running", "running"]])),
    field("Partition", choice("partition", [["", "any"], ...partitions.map((p) => [p, p])])),
    field("Name contains", h("input", { name: "name", value: params.get("name") || "", autocomplete: "off", size: 12 })),
    h("button", { type: "submit" }, "Filter"),
  );
}

async function queueView() {
  const params = new URLSearchParams(location.search);
  const query = new URLSearchParams();
  for (const key of QUEUE_FILTERS) if (params.get(key)) query.set(key, params.get(key));
  const [data, nodes] = await Promise.all([api(`/api/queue?${query}`), api("/api/nodes")]);
  const partitions = [...new Set((nodes.nodes || []).flatMap((n) => n.partitions || []))].sort();
  const jobs = data.jobs || [];
  let rank = 0;
  const rows = jobs.map((job) => rankedRow(job, job.state === "pending" ? ++rank : 0));
  // the form stays while live updates redraw the list (what is being typed is kept)
  let results = document.getElementById("queue-results");
  if (!results) {
    results = h("div", { id: "queue-results" });
    render(
      h("h1", {}, "Queue"),
      h("p", { class: "muted" }, "Pending jobs in the order the scheduler ranks them (priority, then submission), then held and running ones."),
      queueForm(params, partitions),
      results,
    );
  }
  results.replaceChildren(
    ...[
      jobs.length
        ? table("Queue in priority order", ["#", "Job", "User", "Name", "State", "Priority", "GPUs", "Partition", "Submitted", "Reason / node"], rows, { id: "ranked" })
        : h("p", { class: "muted", id: "ranked-empty" }, "No live job matches."),
      data.more ? h("p", { class: "muted", id: "ranked-more" }, `The first ${jobs.length} matching jobs: gpuq queue lists them all.`) : null,
    ].filter(Boolean),
  );
}

// ---- the cluster's history -------------------------------------------------------------

let heatMetric = "util";

// GPUs held over at least two columns of the range at under 10 % on average: the idle ones
function idleGpus(data) {
  const idle = [];
  for (const node of data.nodes) {
    for (const gpu of node.gpus) {
      const known = gpu.cells.filter((c) => c[1] !== null);
      if (gpu.cells.length < 2 || !known.length) continue;
      const mean = known.reduce((sum, c) => sum + c[1], 0) / known.length;
      if (mean < 10) idle.push(`${node.name} GPU ${gpu.index >= 0 ? gpu.index : gpu.uuid} (${mean.toFixed(0)} %)`);
    }
  }
  return idle;
}

async function historyView() {
  const params = new URLSearchParams(location.search);
  const range = params.get("range") || "24h";
  const [{ heatMap, heat }, data] = await Promise.all([
    import("/static/heatmap.js"), // only this page draws the map
    api(`/api/history?range=${encodeURIComponent(range)}`),
  ]);
  const tip = h("p", { class: "heat-tip muted", id: "heat-tip", "aria-live": "polite" }, "Point at (or tap) a cell for its figures.");
  const choose = (value) => {
    history.replaceState(null, "", `/history?range=${value}`);
    refresh();
  };
  const toggle = (value, label) =>
    h("button", { type: "button", "aria-pressed": String(heatMetric === value), "data-metric": value, onclick: () => { heatMetric = value; refresh(); } }, label);
  const idle = idleGpus(data);
  const swatch = (cls, label) => h("span", { class: "swatch" }, h("i", { class: cls }), label);
  const memory = heatMetric === "memory";
  const legend = h(
    "p",
    { class: "legend" },
    swatch("free", "free"),
    swatch("cold", memory ? "little memory" : "held, idle"),
    swatch("hot", memory ? "memory full" : "busy"),
    swatch("unknown", "unknown"),
  );
  // the swatches' colours come from the map's own scale
  legend.querySelector("i.cold").style.background = heat(0);
  legend.querySelector("i.hot").style.background = heat(1);
  const users = data.users || [];
  render(
    h("h1", {}, "History"),
    h(
      "div",
      { class: "toolbar" },
      h("span", { class: "group", role: "group", "aria-label": "Range" }, (data.ranges || []).map((r) => h("button", { type: "button", "aria-pressed": String(r === data.range), "data-range": r, onclick: () => choose(r) }, `last ${r}`))),
      h("span", { class: "group", role: "group", "aria-label": "Colour by" }, toggle("util", "Utilisation"), toggle("memory", "Memory")),
    ),
    data.nodes.length
      ? heatMap(data, heatMetric, (text) => (tip.textContent = text))
      : h("p", { class: "muted" }, "No nodes have registered."),
    tip,
    legend,
    data.cut ? h("p", { class: "muted" }, `${data.cut} more GPUs are not shown.`) : null,
    h("p", { id: "idle-gpus" }, idle.length ? `Held but idle (under 10 % on average): ${idle.join(", ")}` : "No GPU sat idle while held."),
    h("h2", {}, `Usage per user, last ${data.range}`),
    users.length
      ? table(
          "Usage per user",
          ["User", "GPU-hours", "Running GPUs", "Running jobs", "Mean GPU util"],
          users.map((u) =>
            h(
              "tr",
              { "data-user": u.user },
              h("td", {}, userLink(u.user)),
              h("td", { class: "num" }, u.gpu_hours.toFixed(1)),
              h("td", { class: "num" }, String(u.running_gpus)),
              h("td", { class: "num" }, String(u.running_jobs)),
              h("td", { class: "num" }, u.util_mean === null ? "unknown" : `${u.util_mean.toFixed(0)} %`),
            ),
          ),
          { id: "usage" },
        )
      : h("p", { class: "muted" }, "Nobody used a GPU in this range."),
  );
  // on a narrow screen the map scrolls in its box: show its newest end first
  const box = main.querySelector(".heat-box");
  if (box) box.scrollLeft = box.scrollWidth;
  view.poll = 60;
}

// ---- signing in ------------------------------------------------------------------------

async function signIn(body) {
  const reply = await fetch("/api/login", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Gpuq": "1" },
    body: JSON.stringify(body),
  });
  if (!reply.ok) {
    let said = "";
    try {
      const data = await reply.json();
      said = data.error || data.message || "";
    } catch {
      said = "";
    }
    throw new Error(said || `sign-in refused (${reply.status})`);
  }
}

function loginView(problem) {
  view = null;
  closeEvents();
  setLive("off");
  const input = h("input", { id: "token", name: "token", type: "password", autocomplete: "off", required: true, placeholder: "gpuqt_…" });
  const error = h("p", { class: "error", role: "alert", id: "login-error" }, problem || "");
  const form = h(
    "form",
    {
      class: "login",
      onsubmit: async (event) => {
        event.preventDefault();
        try {
          await signIn({ token: input.value.trim() });
          location.replace("/");
        } catch (e) {
          error.textContent = e.message;
        }
      },
    },
    h("label", { for: "token" }, "gpuq token"),
    input,
    h("button", { type: "submit" }, "Sign in"),
  );
  render(
    h("h1", {}, "Sign in"),
    h("p", {}, "Run ", h("code", {}, "gpuq web"), " on the cluster to get a sign-in link, or paste a gpuq token."),
    form,
    error,
  );
}

async function loginFromTicket() {
  const ticket = new URLSearchParams(location.hash.slice(1)).get("ticket");
  history.replaceState(null, "", "/login"); // the ticket leaves the address bar (and history)
  if (!ticket) return loginView();
  try {
    await signIn({ ticket });
    location.replace("/");
  } catch (error) {
    loginView(`${error.message}: the link works once and for a minute; run gpuq web again.`);
  }
}

// ---- rendering, routing and live updates -----------------------------------------------

function render(...children) {
  // a log being read (scrolled up) stays where it is; one at its end follows new output
  const old = document.getElementById("log");
  const logAt = old && old.scrollTop + old.clientHeight < old.scrollHeight - 4 ? old.scrollTop : null;
  const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.action : null;
  main.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== ""));
  main.removeAttribute("aria-busy");
  const pre = document.getElementById("log");
  if (pre) pre.scrollTop = logAt === null ? pre.scrollHeight : logAt;
  if (focused) main.querySelector(`[data-action="${focused}"]`)?.focus();
  if (firstRender) {
    firstRender = false;
    performance.mark("gpuq-first-render");
  }
}

let pending = null;
let pollTimer = null;
let loading = false;
let again = false;

async function refresh() {
  if (!view) return;
  if (loading) {
    again = true;
    return;
  }
  loading = true;
  clearTimeout(pollTimer);
  try {
    await view.load();
    document.body.dataset.loaded = String((Number(document.body.dataset.loaded) || 0) + 1);
  } catch (error) {
    if (error instanceof Unauthorized) loginView();
    else if (view) render(h("h1", {}, "Not available"), h("p", { class: "error", role: "alert" }, error.message));
  } finally {
    loading = false;
  }
  if (again) {
    again = false;
    return refresh();
  }
  if (view && view.poll) pollTimer = setTimeout(refresh, view.poll * 1000);
}

function soon() {
  clearTimeout(pending);
  pending = setTimeout(refresh, 250);
}

let events = null;

function setLive(state) {
  liveBadge.dataset.live = state;
  liveBadge.textContent = state;
}

function openEvents() {
  events = new EventSource("/api/events");
  let opened = false;
  events.addEventListener("open", () => {
    setLive("live");
    if (opened) soon(); // back after a break: what changed meanwhile
    opened = true;
  });
  events.addEventListener("refused", (event) => say(JSON.parse(event.data).error || "live updates refused"));
  events.addEventListener("error", () => {
    setLive("reconnecting");
    if (events.readyState === EventSource.CLOSED) {
      // refused (signed out?): try again after checking who we are
      closeEvents();
      setTimeout(() => whoAmI().then((ok) => ok && view && openEvents()), 3000);
    }
  });
  events.addEventListener("signed-out", () => loginView("Signed out: sign in again."));
  events.addEventListener("jobs", soon);
  events.addEventListener("nodes", soon);
}

function closeEvents() {
  if (events) events.close();
  events = null;
}

async function whoAmI() {
  try {
    me = await api("/api/me");
  } catch (error) {
    if (error instanceof Unauthorized) {
      loginView();
      return false;
    }
    throw error;
  }
  document.getElementById("who").textContent = me.admin ? `${me.user} (admin)` : me.user;
  const mine = document.getElementById("nav-me");
  mine.href = `/users/${encodeURIComponent(me.user)}`;
  mine.hidden = false;
  document.getElementById("logout").hidden = false;
  return true;
}

async function start() {
  // a page left (or kept in the back-forward cache) lets its live stream go: a browser keeps
  // six connections to one site, and streams held by pages left behind stalled the next load
  window.addEventListener("pagehide", closeEvents);
  window.addEventListener("pageshow", (event) => event.persisted && view && !events && (openEvents(), soon()));
  document.getElementById("logout").addEventListener("click", async () => {
    try {
      await fetch("/api/logout", { method: "POST", credentials: "same-origin", headers: { "X-Gpuq": "1" } });
    } finally {
      location.replace("/login");
    }
  });
  const path = location.pathname;
  if (path === "/login") {
    // a sign-in link opened on the sign-in page changes only the fragment: no new load
    window.addEventListener("hashchange", () => location.hash.includes("ticket=") && loginFromTicket());
    if (location.hash.includes("ticket=")) return loginFromTicket();
    return loginView();
  }
  let match;
  if ((match = path.match(/^\/jobs\/(\d+(?:_\d+)?)\/?$/))) {
    const id = match[1];
    document.title = `gpuq: job ${id}`;
    view = { load: () => jobView(id) };
  } else if (path === "/queue") {
    document.title = "gpuq: queue";
    view = { load: queueView };
  } else if (path === "/history") {
    document.title = "gpuq: history";
    view = { load: historyView };
  } else if ((match = path.match(/^\/users\/([^/]+)\/?$/))) {
    const name = decodeURIComponent(match[1]);
    document.title = `gpuq: ${name}`;
    view = { load: () => userView(name) };
  } else {
    document.title = "gpuq: cluster";
    view = { load: clusterView };
  }
  try {
    if (!(await whoAmI())) return;
  } catch (error) {
    render(h("h1", {}, "The dashboard cannot reach gpuq"), h("p", { class: "error", role: "alert" }, error.message));
    return;
  }
  await refresh();
  if (view) openEvents();
}

start();
