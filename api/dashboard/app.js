// The ddpo dashboard: plain pages over the server's JSON API (the same one
// curl and the CLI use). Each page polls what it shows; nothing is cached.
"use strict";

const STATUSES = ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"];
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const JOB_POLL_MS = 1000;   // the job page: about once a second
const LIST_POLL_MS = 2000;  // lists
const SLOW_EVERY = 3;       // the chart and the logs: every third poll of the job
const LOG_LINES = 100;

// --- helpers -----------------------------------------------------------------

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;",
  })[c]);
}

// The bearer token this browser presents, asked for once and kept in its
// local storage (for this server's origin only).
const TOKEN_KEY = "ddpo-token";
const storedToken = () => localStorage.getItem(TOKEN_KEY);

async function api(path, options = {}) {
  const token = storedToken();
  const response = await fetch(path, {
    ...options,
    headers: {
      "content-type": "application/json",
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    },
  });
  const body = response.headers.get("content-type")?.includes("json")
    ? await response.json() : await response.text();
  if (response.status === 401) {
    askForToken(Boolean(token));
    throw new Error(token ? "the saved token was refused" : "this server needs a token");
  }
  if (!response.ok) {
    const detail = body && body.detail;
    const message = Array.isArray(detail) ? detail.map((d) => d.msg).join("; ")
      : detail || `${response.status} ${response.statusText}`;
    throw new Error(message);
  }
  return body;
}

// Shown over the page when the server wants a token: saved, the page reloads.
function askForToken(refused) {
  if (document.getElementById("token-form")) return;
  const card = document.createElement("form");
  card.id = "token-form";
  card.className = "card";
  card.innerHTML = `
    <h2>${refused ? "The saved token was refused" : "This server needs a token"}</h2>
    <p class="muted">Paste a read-only token (the server's DDPO_READ_TOKEN) to watch jobs, or a
      user token (DDPO_USER_TOKEN) to submit and cancel too. It is kept in this browser only.</p>
    <label>Token <input name="token" type="password" autocomplete="off" required></label>
    <button type="submit">Save</button>`;
  card.addEventListener("submit", (event) => {
    event.preventDefault();
    localStorage.setItem(TOKEN_KEY, new FormData(card).get("token").trim());
    location.reload();
  });
  page().prepend(card);
}

function showSignOut() {
  if (!storedToken()) return;
  const link = document.createElement("a");
  link.href = "#";
  link.id = "forget-token";
  link.textContent = "forget token";
  link.addEventListener("click", (event) => {
    event.preventDefault();
    localStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  document.querySelector("header").append(link);
}

function connection(ok, message) {
  const el = document.getElementById("connection");
  el.textContent = ok ? `updated ${new Date().toLocaleTimeString()}` : `not updated: ${message}`;
  el.className = ok ? "muted" : "problem";
}

// Runs fn now and again every ms after it settles (never two at once).
function every(ms, fn) {
  const tick = async () => {
    let again = true;
    try {
      again = (await fn()) !== false;
      connection(true);
    } catch (error) {
      connection(false, error.message);
    }
    if (again) setTimeout(tick, ms);
  };
  tick();
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
}

const fixed = (value, digits) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));
const percent = (value) => (value === null || value === undefined ? "–" : `${(100 * value).toFixed(2)}%`);
const rate = (value) => (value === null || value === undefined ? "–" : `${Math.round(value).toLocaleString()}/s`);
const badge = (status) => `<span class="badge ${esc(status)}">${esc(status)}</span>`;
const topology = (spec) => `${spec.topology.num_machines} × ${spec.topology.num_processes}`;

function bar(job, big = false) {
  const pct = job.status === "succeeded" ? 100 : job.progress ? job.progress.percent : 0;
  const kind = job.status === "succeeded" ? " done" : job.status === "failed" ? " bad" : "";
  return `<div class="bar${big ? " big" : ""}${kind}" title="${pct.toFixed(1)}%">` +
    `<span style="width:${pct}%"></span></div>`;
}

const page = () => document.getElementById("page");

// --- jobs ----------------------------------------------------------------------

function jobsPage() {
  const wanted = new URLSearchParams(location.search).get("status") || "";
  page().innerHTML = `
    <h1>Jobs</h1>
    <div class="card">
      <div class="row filter" style="margin-bottom:10px">
        <label>Status <select id="status-filter">
          <option value="">all</option>
          ${STATUSES.map((s) => `<option ${s === wanted ? "selected" : ""}>${s}</option>`).join("")}
        </select></label>
        <span id="jobs-count" class="muted"></span>
        <a class="button" href="/ui/submit" style="margin-left:auto">New job</a>
      </div>
      <table id="jobs">
        <thead><tr><th class="num">id</th><th>name</th><th>status</th><th>topology</th>
          <th class="num">batch</th><th class="num">epochs</th><th>progress</th>
          <th class="num">duration</th><th class="num">accuracy</th></tr></thead>
        <tbody></tbody>
      </table>
    </div>`;
  document.getElementById("status-filter").addEventListener("change", (event) => {
    const status = event.target.value;
    history.replaceState(null, "", status ? `?status=${status}` : location.pathname);
    refresh();
  });
  const refresh = async () => {
    const status = document.getElementById("status-filter").value;
    const jobs = await api(`/jobs?limit=200${status ? `&status=${status}` : ""}`);
    document.getElementById("jobs-count").textContent = `${jobs.count} job(s)`;
    document.querySelector("#jobs tbody").innerHTML = jobs.data.map((job) => `
      <tr data-job="${job.id}">
        <td class="num"><a href="/ui/jobs/${job.id}">${job.id}</a></td>
        <td>${esc(job.name || "")}</td>
        <td>${badge(job.status)}</td>
        <td>${topology(job.spec)}</td>
        <td class="num">${job.spec.batch_size}</td>
        <td class="num">${job.spec.epochs}</td>
        <td>${bar(job)}</td>
        <td class="num">${duration(job.timing.running_seconds)}</td>
        <td class="num">${percent(job.result && job.result.test_accuracy)}</td>
      </tr>`).join("") || `<tr><td colspan="9" class="muted">No jobs${status ? ` ${status}` : ""}.</td></tr>`;
  };
  every(LIST_POLL_MS, refresh);
}

// --- one job ---------------------------------------------------------------------

function jobPage(id) {
  page().innerHTML = `
    <h1>Job ${id} <span id="job-name" class="muted"></span> <span id="status"></span>
      <button id="cancel" class="danger" style="margin-left:auto" disabled>Cancel</button></h1>
    <div class="card">
      <div class="row" style="justify-content:space-between;margin-bottom:8px">
        <span><span id="percent" class="big-number">0%</span> <span id="where" class="muted"></span></span>
        <span id="eta" class="muted"></span>
      </div>
      <div id="progress-bar"></div>
      <div id="pending" class="muted" style="margin-top:8px"></div>
    </div>
    <div class="card"><h2>Loss and throughput</h2><div id="loss-chart" class="chart"></div></div>
    <div id="error-card" class="card" hidden><h2>Error</h2><div id="error"></div></div>
    <div class="grid">
      <div class="card"><h2>Result</h2><div id="result" class="muted">When it has finished.</div></div>
      <div class="card"><h2>Timing</h2><dl id="timing" class="facts"></dl></div>
      <div class="card"><h2>Spec</h2><dl id="spec" class="facts"></dl></div>
    </div>
    <div class="card" style="margin-top:16px"><h2>Machines</h2>
      <table id="machines"><thead><tr><th class="num">machine</th><th>node</th><th>address</th>
        <th>state</th><th class="num">exit code</th><th>failing rank</th></tr></thead><tbody></tbody></table>
    </div>
    <div class="card"><h2>Last ${LOG_LINES} log lines</h2><pre id="logs">…</pre></div>`;

  const cancel = document.getElementById("cancel");
  cancel.addEventListener("click", async () => {
    if (!confirm(`Cancel job ${id}? Its ranks are stopped on every node.`)) return;
    cancel.disabled = true;
    try {
      render(await api(`/jobs/${id}/cancel`, { method: "POST" }));
    } catch (error) {
      alert(`Could not cancel: ${error.message}`);
    }
  });

  let lastSeq = null;
  let chartPoints = -1;
  let finalLogs = false;

  function render(job) {
    document.title = `ddpo · job ${job.id} ${job.status}`;
    document.getElementById("job-name").textContent = job.name || "";
    document.getElementById("status").innerHTML = badge(job.status);
    cancel.disabled = TERMINAL.has(job.status) || job.status === "cancelling";
    const p = job.progress;
    const pct = job.status === "succeeded" ? 100 : p ? p.percent : 0;
    document.getElementById("percent").textContent = `${pct.toFixed(1)}%`;
    document.getElementById("where").textContent = p
      ? `epoch ${p.epoch}/${p.epochs} · batch ${p.batch}/${p.batches_per_epoch} · loss ${fixed(p.loss, 4)} · ${rate(p.samples_per_sec)}`
      : "";
    document.getElementById("eta").textContent =
      p && p.eta_seconds !== null && job.status === "running" ? `ETA ${duration(p.eta_seconds)}` : "";
    document.getElementById("progress-bar").innerHTML = bar(job, true);
    document.getElementById("pending").textContent = job.pending_reason || "";

    const t = job.timing;
    document.getElementById("timing").innerHTML = [
      ["queued", duration(t.queued_seconds)],
      ["running", duration(t.running_seconds)],
      ["setup", t.setup_seconds !== null ? `${fixed(t.setup_seconds, 2)} s` : "–"],
      ["training", t.training_seconds !== null ? `${fixed(t.training_seconds, 1)} s` : "–"],
      ["evaluation", t.eval_seconds !== null ? `${fixed(t.eval_seconds, 2)} s` : "–"],
      ["threads / process", t.threads_per_process ?? "–"],
    ].map(([k, v]) => `<dt>${k}</dt><dd>${esc(v)}</dd>`).join("");

    const s = job.spec;
    document.getElementById("spec").innerHTML = [
      ["topology", `${topology(s)} (world size ${job.world_size})`],
      ["backend", s.backend], ["trainer", s.trainer],
      ["batch / process", s.batch_size], ["epochs", s.epochs], ["lr", s.lr], ["seed", s.seed],
      ["attempt", job.attempt],
      ["rendezvous", job.master_port ? `${job.master_addr}:${job.master_port}` : "–"],
    ].map(([k, v]) => `<dt>${k}</dt><dd>${esc(v)}</dd>`).join("");

    const r = job.result;
    if (r) {
      document.getElementById("result").className = "";
      document.getElementById("result").innerHTML = `
        <div id="accuracy" class="big-number">${percent(r.test_accuracy)}</div>
        <div class="muted" style="margin-bottom:8px">test accuracy (10,000 images)</div>
        <dl class="facts"><dt>test loss</dt><dd>${fixed(r.test_loss, 4)}</dd>
          <dt>last-epoch train loss</dt><dd>${fixed(r.train_loss, 4)}</dd>
          <dt>throughput</dt><dd>${rate(r.samples_per_sec)}</dd>
          ${job.checkpoint ? `<dt>model</dt><dd><a href="${esc(job.checkpoint.url)}">epoch ${job.checkpoint.epoch} checkpoint</a></dd>` : ""}
        </dl>`;
    }

    const e = job.error;
    document.getElementById("error-card").hidden = !e;
    if (e) {
      const where = [e.machine_id !== null ? `machine ${e.machine_id}` : "", e.rank !== null ? `rank ${e.rank}` : "",
        e.node ? `node ${e.node}` : "", e.exit_code !== null ? `exit code ${e.exit_code}` : ""].filter(Boolean).join(" · ");
      document.getElementById("error").innerHTML = `
        <p><strong>${esc(e.reason)}</strong>: ${esc(e.message)}</p>
        <p class="muted">${esc(where)}</p>
        ${e.traceback_tail ? `<pre class="error">${esc(e.traceback_tail)}</pre>` : ""}`;
    }

    document.querySelector("#machines tbody").innerHTML = job.parts.map((part) => `
      <tr><td class="num">${part.machine_id}</td><td>${esc(part.node_name)}</td><td>${esc(part.node_address)}</td>
        <td>${badge(part.status)}</td><td class="num">${part.exit_code ?? "–"}</td>
        <td>${part.failing_rank ?? "–"}</td></tr>`).join("") ||
      `<tr><td colspan="6" class="muted">Not placed yet.</td></tr>`;
  }

  async function refreshChart() {
    const metrics = await api(`/jobs/${id}/metrics?max_points=500`);
    const points = metrics.points;
    if (points.length === chartPoints || typeof Plotly === "undefined") return;
    chartPoints = points.length;
    const steps = points.map((q) => q.step);
    Plotly.react("loss-chart", [
      { x: steps, y: points.map((q) => q.loss), name: "loss", mode: "lines+markers", line: { color: "#2f6fde" }, marker: { size: 4 } },
      { x: steps, y: points.map((q) => q.samples_per_sec), name: "samples/s", yaxis: "y2", mode: "lines", line: { color: "#c78a00", dash: "dot" } },
    ], {
      margin: { l: 50, r: 60, t: 10, b: 40 },
      xaxis: { title: { text: "step" } },
      yaxis: { title: { text: "loss" }, rangemode: "tozero" },
      yaxis2: { title: { text: "samples/s" }, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false },
      legend: { orientation: "h", y: 1.12 },
      font: { family: getComputedStyle(document.body).fontFamily, size: 12 },
    }, { displayModeBar: false, responsive: true });
  }

  async function refreshLogs(job) {
    const logs = await api(`/jobs/${id}/logs?tail=${LOG_LINES}`);
    const el = document.getElementById("logs");
    const stick = el.scrollTop + el.clientHeight >= el.scrollHeight - 4;
    el.textContent = logs.lines.map((l) => `[m${l.machine_id} ${l.rank === null ? "launcher" : `rank ${l.rank}`}] ${l.text}`).join("\n") || "(nothing yet)";
    if (stick) el.scrollTop = el.scrollHeight;
    finalLogs = TERMINAL.has(job.status);
  }

  // The job every poll; the chart (when there is new progress) and the logs
  // every third one, and once more when the job has ended.
  let tick = 0;
  every(JOB_POLL_MS, async () => {
    const job = await api(`/jobs/${id}`);
    render(job);
    const ended = TERMINAL.has(job.status);
    const slow = tick++ % SLOW_EVERY === 0 || ended;
    const seq = job.progress ? `${job.progress.epoch}/${job.progress.batch}` : null;
    if (slow && (seq !== lastSeq || chartPoints < 0)) {
      lastSeq = seq;
      await refreshChart();
    }
    if (slow && !finalLogs) await refreshLogs(job);
    return !(ended && finalLogs);
  });
}

// --- submit ------------------------------------------------------------------------

function submitPage() {
  page().innerHTML = `
    <h1>Submit a job</h1>
    <div class="card">
      <form id="submit-form" class="spec">
        <label>Name <input name="name" placeholder="optional"></label>
        <label>Machines <input name="num_machines" type="number" min="1" value="1"><small>nodes, one part each</small></label>
        <label>Processes per machine <input name="num_processes" type="number" min="1" value="1"></label>
        <label>Backend <select name="backend"><option>gloo</option><option>nccl</option></select><small>nccl needs a GPU per process</small></label>
        <label>Batch size <input name="batch_size" type="number" min="1" value="128"><small>per process: 128 / processes keeps the global batch</small></label>
        <label>Epochs <input name="epochs" type="number" min="1" value="1"></label>
        <label>Learning rate <input name="lr" type="number" step="any" min="0" value="0.5"></label>
        <label>Seed <input name="seed" type="number" min="0" value="0"></label>
        <label>Max steps per epoch <input name="max_steps_per_epoch" type="number" min="1" placeholder="all"><small>a shorter run</small></label>
        <div class="actions"><button class="primary" type="submit">Submit</button><span id="submit-problem" class="problem"></span></div>
      </form>
    </div>`;
  document.getElementById("submit-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = new FormData(event.target);
    const number = (name) => Number(form.get(name));
    const spec = {
      topology: { num_machines: number("num_machines"), num_processes: number("num_processes") },
      backend: form.get("backend"),
      batch_size: number("batch_size"),
      epochs: number("epochs"),
      lr: number("lr"),
      seed: number("seed"),
    };
    if (form.get("name")) spec.name = form.get("name");
    if (form.get("max_steps_per_epoch")) spec.max_steps_per_epoch = number("max_steps_per_epoch");
    const problem = document.getElementById("submit-problem");
    problem.textContent = "";
    try {
      const job = await api("/jobs", { method: "POST", body: JSON.stringify(spec) });
      location.href = `/ui/jobs/${job.id}`;
    } catch (error) {
      problem.textContent = error.message;
    }
  });
}

// --- nodes ---------------------------------------------------------------------------

function nodesPage() {
  page().innerHTML = `
    <h1>Nodes</h1>
    <div class="card"><table id="nodes">
      <thead><tr><th>name</th><th>address</th><th>state</th><th class="num">slots</th>
        <th class="num">cpus</th><th class="num">gpus</th><th>last heartbeat</th><th>running</th></tr></thead>
      <tbody></tbody></table></div>`;
  every(LIST_POLL_MS, async () => {
    const nodes = await api("/nodes");
    const now = Date.now();
    document.querySelector("#nodes tbody").innerHTML = nodes.map((n) => `
      <tr><td>${esc(n.name)}</td><td>${esc(n.address)}</td><td>${badge(n.state)}</td>
        <td class="num">${n.slots}</td><td class="num">${n.cpus}</td><td class="num">${n.gpus}</td>
        <td>${duration((now - Date.parse(n.last_heartbeat_at)) / 1000)} ago</td>
        <td>${n.parts.map((p) => `<a href="/ui/jobs/${p.job_id}">job ${p.job_id}</a> m${p.machine_id} ${badge(p.status)}`).join(", ") || "–"}</td></tr>`
    ).join("") || `<tr><td colspan="8" class="muted">No worker has registered.</td></tr>`;
  });
}

// --- routing ---------------------------------------------------------------------------

function route() {
  const path = location.pathname.replace(/\/+$/, "");
  const job = path.match(/^\/ui\/jobs\/(\d+)$/);
  const section = job ? "jobs" : path.split("/")[2] || "jobs";
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === section));
  if (job) return jobPage(Number(job[1]));
  if (section === "submit") return submitPage();
  if (section === "nodes") return nodesPage();
  if (section === "jobs") return jobsPage();
  page().innerHTML = `<h1>Not found</h1><p><a href="/ui/jobs">Jobs</a></p>`;
}

showSignOut();
route();
