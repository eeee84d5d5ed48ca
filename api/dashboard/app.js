// The ddpo dashboard: plain pages over the server's JSON API (the same one
// curl and the CLI use). Each page polls what it shows; nothing is cached.
"use strict";

const STATUSES = ["queued", "running", "cancelling", "succeeded", "failed", "cancelled"];
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const JOB_POLL_MS = 1000;   // the job page: about once a second
const LIST_POLL_MS = 2000;  // lists
const SLOW_EVERY = 3;
const BUILT_IN_METRICS = new Set(["loss", "samples_per_sec"]);       // the chart and the logs: every third poll of the job
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

// A link from `ddpo dashboard` carries the token in its fragment (#token=...),
// which browsers never send to a server: keep it, then drop it from the
// address bar and the history.
(function takeTokenFromLink() {
  const given = new URLSearchParams(location.hash.slice(1)).get("token");
  if (given) {
    localStorage.setItem(TOKEN_KEY, given);
    history.replaceState(null, "", location.pathname + location.search);
  }
})();

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
    throw Object.assign(new Error(message), { status: response.status });
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
    <p class="muted">Paste your key (an admin makes one with <code>ddpo keys create</code>), or a
      role's token: a read-only one (the server's DDPO_READ_TOKEN) to watch jobs, a user token
      (DDPO_USER_TOKEN) to submit and cancel too. It is kept in this browser only.
      On the server's host, <code>ddpo dashboard</code> prints a link that carries one.</p>
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
// An elastic job's machines are a range: "1–3 × 1".
const machines = (t) => (t.max_machines ? `${t.num_machines}–${t.max_machines}` : `${t.num_machines}`);
const topology = (spec) => `${machines(spec.topology)} × ${spec.topology.num_processes}`;

function bar(job, big = false) {
  const pct = job.status === "succeeded" ? 100 : job.progress ? job.progress.percent : 0;
  const kind = job.status === "succeeded" ? " done" : job.status === "failed" ? " bad" : "";
  return `<div class="bar${big ? " big" : ""}${kind}" title="${pct.toFixed(1)}%">` +
    `<span style="width:${pct}%"></span></div>`;
}

const page = () => document.getElementById("page");

// The thing at path, or null once the page says it does not exist.
async function orNotFound(path, what, back, backText) {
  try {
    return await api(path);
  } catch (error) {
    if (error.status !== 404) throw error;
    page().innerHTML = `<h1>${esc(what)} does not exist</h1>
      <div class="card"><p id="not-found">${esc(error.message)}.</p><p><a href="${back}">${esc(backText)}</a></p></div>`;
    return null;
  }
}

const when = (iso) => (iso ? new Date(iso).toLocaleString() : "–");

// A part the orchestrator stopped says why: the job's deadline, a cancel, or
// the failure elsewhere that ended its attempt.
function whyStopped(job, part) {
  if (part.error) return part.error;
  if (!["cancelled", "stopping"].includes(part.status)) return "";
  const e = job.error;
  if (e && e.reason === "deadline") return `stopped at the job's deadline: ${e.message}`;
  if (["cancelling", "cancelled"].includes(job.status)) return "stopped: the job was cancelled";
  if (e) return `stopped: ${e.reason} on machine ${e.machine_id ?? "?"}`;
  return "stopped by the server";
}

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
        <a id="compare-selected" class="button" href="/ui/compare" style="margin-left:auto">Compare selected</a>
        <a class="button" href="/ui/submit">New job</a>
      </div>
      <table id="jobs">
        <thead><tr><th title="pick jobs to compare"></th><th class="num">id</th><th>name</th><th>owner</th><th>status</th><th>topology</th>
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
  // Jobs ticked for the compare view, kept across refreshes.
  const picked = new Set();
  const compareLink = () => {
    const link = document.getElementById("compare-selected");
    link.href = `/ui/compare${picked.size ? `?jobs=${[...picked].sort((a, b) => a - b).join(",")}` : ""}`;
    link.textContent = picked.size ? `Compare ${picked.size} selected` : "Compare selected";
  };
  document.getElementById("jobs").addEventListener("change", (event) => {
    if (!event.target.matches("input[data-pick]")) return;
    const id = Number(event.target.dataset.pick);
    if (event.target.checked) picked.add(id); else picked.delete(id);
    compareLink();
  });
  const refresh = async () => {
    const status = document.getElementById("status-filter").value;
    const jobs = await api(`/jobs?limit=200${status ? `&status=${status}` : ""}`);
    document.getElementById("jobs-count").textContent = `${jobs.count} job(s)`;
    document.querySelector("#jobs tbody").innerHTML = jobs.data.map((job) => `
      <tr data-job="${job.id}">
        <td><input type="checkbox" data-pick="${job.id}" aria-label="compare job ${job.id}" ${picked.has(job.id) ? "checked" : ""}></td>
        <td class="num"><a href="/ui/jobs/${job.id}">${job.id}</a></td>
        <td>${esc(job.name || "")}${job.pending_reason ? `<div class="muted small pending">${esc(job.pending_reason)}</div>` : ""}</td>
        <td class="owner">${esc(job.owner || "–")}</td>
        <td>${badge(job.status)}</td>
        <td>${topology(job.spec)}</td>
        <td class="num">${job.spec.batch_size}</td>
        <td class="num">${job.spec.epochs}</td>
        <td>${bar(job)}</td>
        <td class="num">${duration(job.timing.running_seconds)}</td>
        <td class="num">${percent(job.result && job.result.test_accuracy)}</td>
      </tr>`).join("") || `<tr><td colspan="11" class="muted">No jobs${status ? ` ${status}` : ""}.</td></tr>`;
  };
  every(LIST_POLL_MS, refresh);
}

// --- one job ---------------------------------------------------------------------

function jobPage(id) {
  page().innerHTML = `
    <h1>Job ${id} <span id="job-name" class="muted"></span> <span id="status"></span>
      <span class="muted small">by <span id="owner">–</span><span id="sweep-of"></span></span>
      <button id="cancel" class="danger" style="margin-left:auto" disabled>Cancel</button></h1>
    <div class="card">
      <div class="row" style="justify-content:space-between;margin-bottom:8px">
        <span><span id="percent" class="big-number">0%</span> <span id="where" class="muted"></span></span>
        <span id="eta" class="muted"></span>
      </div>
      <div id="progress-bar"></div>
      <div id="pending" class="muted" style="margin-top:8px"></div>
      <form id="priority-form" class="row filter" style="margin-top:8px" hidden>
        <label>Priority <input id="priority" name="priority" type="number" min="-1000" max="1000" step="1" required></label>
        <button type="submit">Set</button>
        <span class="muted small">higher is tried first; while queued</span>
      </form>
    </div>
    <div class="card"><h2>Loss and throughput</h2><div id="loss-chart" class="chart"></div>
      <p id="chart-empty" class="muted" hidden></p></div>
    <div id="metrics-card" class="card" hidden><h2>The trainer's metrics</h2><div id="metrics-chart" class="chart"></div></div>
    <div id="error-card" class="card" hidden><h2>Error</h2><div id="error"></div></div>
    <div class="grid">
      <div class="card"><h2>Result</h2><div id="result" class="muted">When it has finished.</div></div>
      <div class="card"><h2>Timing</h2><dl id="timing" class="facts"></dl></div>
      <div class="card"><h2>Spec</h2><dl id="spec" class="facts"></dl></div>
    </div>
    <div class="card" style="margin-top:16px"><h2>Attempts</h2>
      <table id="attempts"><thead><tr><th class="num">attempt</th><th>started</th><th>finished</th>
        <th>resumed from</th><th>how it ended</th></tr></thead><tbody></tbody></table>
    </div>
    <div class="card"><h2>Machines <span class="muted small">(the current attempt)</span></h2>
      <table id="machines"><thead><tr><th class="num">machine</th><th>node</th><th>address</th>
        <th>state</th><th class="num">exit code</th><th>failing rank</th><th>why it stopped</th></tr></thead><tbody></tbody></table>
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

  const priorityForm = document.getElementById("priority-form");
  priorityForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    const priority = Number(document.getElementById("priority").value);
    try {
      render(await api(`/jobs/${id}`, { method: "PATCH", body: JSON.stringify({ priority }) }));
    } catch (error) {
      alert(`Could not change the priority: ${error.message}`);
    }
  });

  let lastSeq = null;
  let chartPoints = -1;
  let finalLogs = false;

  function render(job) {
    document.title = `ddpo · job ${job.id} ${job.status}`;
    document.getElementById("job-name").textContent = job.name || "";
    document.getElementById("status").innerHTML = badge(job.status);
    document.getElementById("sweep-of").innerHTML = job.sweep_id
      ? `, a trial of <a href="/ui/sweeps/${job.sweep_id}">sweep ${job.sweep_id}</a>` : "";
    // Only its owner or an admin may steer a job: say so rather than offer it.
    const steer = maySteer(job);
    cancel.hidden = TERMINAL.has(job.status);
    cancel.disabled = job.status === "cancelling" || !steer;
    cancel.title = steer ? "" : `job ${job.id} is ${job.owner}'s: only its owner or an admin may cancel it`;
    priorityForm.hidden = job.status !== "queued" || !steer;
    const priorityInput = document.getElementById("priority");
    if (document.activeElement !== priorityInput) priorityInput.value = job.priority;
    const p = job.progress;
    const pct = job.status === "succeeded" ? 100 : p ? p.percent : 0;
    document.getElementById("percent").textContent = `${pct.toFixed(1)}%`;
    document.getElementById("where").textContent = p
      ? `epoch ${p.epoch}/${p.epochs} · batch ${p.batch}/${p.batches_per_epoch} · loss ${fixed(p.loss, 4)} · ${rate(p.samples_per_sec)}`
      : "";
    document.getElementById("eta").textContent =
      p && p.eta_seconds !== null && job.status === "running" ? `ETA ${duration(p.eta_seconds)}` : "";
    document.getElementById("progress-bar").innerHTML = bar(job, true);
    document.getElementById("owner").textContent = job.owner || "anyone (no owner recorded)";
    document.getElementById("pending").textContent = job.status === "queued"
      ? `${job.queue_position ? `#${job.queue_position} in the queue (priority ${job.priority}): ` : ""}${job.pending_reason || ""}`
      : "";

    const t = job.timing;
    document.getElementById("timing").innerHTML = [
      ["created", when(t.created_at)],
      ["started", when(t.started_at)],
      ["finished", when(t.finished_at)],
      ["queued", duration(t.queued_seconds)],
      ["running", duration(t.running_seconds)],
      ["setup", t.setup_seconds !== null ? `${fixed(t.setup_seconds, 2)} s` : "–"],
      ["training", t.training_seconds !== null ? `${fixed(t.training_seconds, 1)} s` : "–"],
      ["evaluation", t.eval_seconds !== null ? `${fixed(t.eval_seconds, 2)} s` : "–"],
      ["threads / process", t.threads_per_process ?? "–"],
    ].map(([k, v]) => `<dt>${k}</dt><dd>${esc(v)}</dd>`).join("");

    const s = job.spec;
    const what = s.script
      ? [["script", [s.script.path, ...s.script.args].join(" ")],
         ["content", s.script.sha256 ? `sha256 ${s.script.sha256.slice(0, 12)}…` : "not pinned yet"]]
      : [["trainer", s.trainer],
         ...(Object.keys(s.params || {}).length
           ? [["params", Object.entries(s.params).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ")]]
           : [])];
    const specRows = [
      ["owner", job.owner || "–"],
      ["priority", job.priority],
      ["topology", `${topology(s)} (world size ${job.world_size})`],
      ["backend", s.backend], ...what,
      ["batch / process", s.batch_size], ["epochs", s.epochs], ["lr", s.lr], ["seed", s.seed],
      ["max steps / epoch", s.max_steps_per_epoch ?? "all"],
      ["max restarts", s.max_restarts],
      ["deadline", s.max_run_seconds !== null && s.max_run_seconds !== undefined
        ? `${s.max_run_seconds} s after the first start (max_run_seconds)` : "none"],
      ["attempt", job.attempt],
      ["rendezvous", job.master_port ? `${job.master_addr}:${job.master_port}` : "–"],
      ["performance", Object.entries(s.performance || {}).map(([k, v]) => `${k}=${v}`).join(", ")],
    ];
    // A script reads its own arguments, not the trainer fields of the spec.
    const trainerOnly = new Set(["batch / process", "epochs", "lr", "seed", "max steps / epoch", "performance"]);
    document.getElementById("spec").innerHTML = specRows.filter(([k]) => !(s.script && trainerOnly.has(k)))
      .map(([k, v]) => `<dt>${k}</dt><dd>${esc(v)}</dd>`).join("");

    const r = job.result;
    if (!r) {
      document.getElementById("result").textContent = {
        failed: "None: the job failed (see Error).",
        cancelled: "None: the job was cancelled.",
        succeeded: "None reported.",
      }[job.status] || "When it has finished.";
    } else {
      document.getElementById("result").className = "";
      document.getElementById("result").innerHTML = `
        <div id="accuracy" class="big-number">${percent(r.test_accuracy)}</div>
        <div class="muted" style="margin-bottom:8px">test accuracy${s.trainer === "mnist" ? " (10,000 images)" : ""}</div>
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

    document.querySelector("#attempts tbody").innerHTML = job.attempts.map((a) => `
      <tr data-attempt="${a.number}"><td class="num">${a.number}</td><td>${when(a.started_at)}</td>
        <td>${a.finished_at ? when(a.finished_at) : "running"}</td>
        <td class="resumed">${a.resumed_from_step !== null ? `step ${a.resumed_from_step} (a step checkpoint)`
          : a.resumed_from_epoch !== null ? `the checkpoint of epoch ${a.resumed_from_epoch}` : "the start"}
          <span class="muted small">· ${a.world_size} rank(s), global batch ${a.global_batch}</span></td>
        <td class="ended">${a.error && !(a.ended || "").startsWith("resized")
          ? `<strong>${esc(a.error.reason)}</strong>: ${esc(a.error.message)}`
          : a.ended ? esc(a.ended)
          : a.stop ? `stopping: ${esc(a.stop.reason)}${a.stop.detail ? ` ${esc(a.stop.detail)}` : ""}, by ${when(a.stop.deadline_at)}`
          : a.finished_at ? esc(job.status) : "–"}</td></tr>`
    ).join("") || `<tr><td colspan="5" class="muted">${job.status === "queued" ? `Not started: ${esc(job.pending_reason || "waiting")}` : "None."}</td></tr>`;

    document.querySelector("#machines tbody").innerHTML = job.parts.map((part) => `
      <tr><td class="num">${part.machine_id}</td><td>${esc(part.node_name)}</td><td>${esc(part.node_address)}</td>
        <td>${badge(part.status)}</td><td class="num">${part.exit_code ?? "–"}</td>
        <td>${part.failing_rank ?? "–"}</td><td class="why">${esc(whyStopped(job, part))}</td></tr>`).join("") ||
      `<tr><td colspan="7" class="muted">Not placed yet.</td></tr>`;
  }

  async function refreshChart() {
    const metrics = await api(`/jobs/${id}/metrics?max_points=500`);
    const points = metrics.points;
    if (points.length === chartPoints || typeof Plotly === "undefined") return;
    chartPoints = points.length;
    const empty = document.getElementById("chart-empty");
    empty.hidden = points.length > 0;
    document.getElementById("loss-chart").hidden = points.length === 0;
    if (points.length === 0) {
      empty.textContent = "No progress reported (rank 0 reports every 10 batches).";
      return;
    }
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
    refreshOwnMetrics(metrics.names.filter((n) => !BUILT_IN_METRICS.has(n)), points, steps);
  }

  // Whatever else the trainer reports (perplexity, accuracy, ...): one small
  // chart each, stacked, sharing the step axis.
  function refreshOwnMetrics(names, points, steps) {
    const card = document.getElementById("metrics-card");
    card.hidden = names.length === 0;
    if (names.length === 0) return;
    const traces = names.map((name, i) => ({
      x: steps, y: points.map((q) => q.metrics[name] ?? null), name, mode: "lines+markers",
      marker: { size: 4 }, xaxis: "x", yaxis: i === 0 ? "y" : `y${i + 1}`,
    }));
    const layout = {
      grid: { rows: names.length, columns: 1, pattern: "coupled", roworder: "top to bottom" },
      height: 70 + 150 * names.length,
      margin: { l: 60, r: 20, t: 10, b: 40 },
      xaxis: { title: { text: "step" } },
      legend: { orientation: "h", y: 1.05 },
      font: { family: getComputedStyle(document.body).fontFamily, size: 12 },
    };
    names.forEach((name, i) => { layout[i === 0 ? "yaxis" : `yaxis${i + 1}`] = { title: { text: name } }; });
    document.getElementById("metrics-chart").style.height = `${layout.height}px`;
    Plotly.react("metrics-chart", traces, layout, { displayModeBar: false, responsive: true });
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
    const job = await orNotFound(`/jobs/${id}`, `Job ${id}`, "/ui/jobs", "All jobs");
    if (job === null) return false;
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
        <label>Runs <select name="runs"><option value="trainer:mnist">trainer mnist</option></select><small>a trainer the live nodes offer, or a script from their --script-dir</small></label>
        <label>Params <textarea name="params" rows="3" placeholder='{"hidden": 128} (JSON; the trainer&#39;s schema says which)'></textarea><small id="params-schema"></small></label>
        <label>Script arguments <input name="script_args" placeholder="--epochs 3 --lr 0.1"><small>for a script: as torchrun passes them</small></label>
        <label>Machines <input name="num_machines" type="number" min="1" value="1"><small>nodes, one part each</small></label>
        <label>Processes per machine <input name="num_processes" type="number" min="1" value="1"></label>
        <label>Backend <select name="backend"><option>gloo</option><option>nccl</option></select><small>nccl needs a GPU per process</small></label>
        <label>Batch size <input name="batch_size" type="number" min="1" value="128"><small>per process: 128 / processes keeps the global batch</small></label>
        <label>Epochs <input name="epochs" type="number" min="1" value="1"></label>
        <label>Learning rate <input name="lr" type="number" step="any" min="0" value="0.5"></label>
        <label>Seed <input name="seed" type="number" min="0" value="0"></label>
        <label>Max steps per epoch <input name="max_steps_per_epoch" type="number" min="1" placeholder="all"><small>a shorter run</small></label>
        <label>Priority <input name="priority" type="number" min="-1000" max="1000" value="0"><small>higher starts first; may preempt lower ones</small></label>
        <label>Restarts <input name="max_restarts" type="number" min="0" max="100" value="0"><small>new attempts after a lost node or a killed rank</small></label>
        <label>Deadline <input name="max_run_seconds" type="number" min="1" step="any" placeholder="none"><small>seconds of running before it is failed</small></label>
        <div class="actions"><button class="primary" type="submit">Submit</button><span id="submit-problem" class="problem"></span></div>
      </form>
    </div>`;
  const runs = document.querySelector("select[name=runs]");
  const schemas = {};
  api("/trainers").then((offered) => {
    const options = [
      ...offered.trainers.map((t) => {
        schemas[`trainer:${t.name}`] = t.params_schema;
        return `<option value="trainer:${esc(t.name)}">trainer ${esc(t.name)} ${esc(t.version)}</option>`;
      }),
      ...offered.scripts.map((s) => `<option value="script:${esc(s.path)}">script ${esc(s.path)}</option>`),
    ];
    if (options.length) runs.innerHTML = options.join("");
    runs.value = "trainer:mnist";
    showSchema();
  }).catch(() => {});
  const showSchema = () => {
    const schema = schemas[runs.value];
    const names = schema && schema.properties ? Object.keys(schema.properties) : [];
    document.getElementById("params-schema").textContent =
      names.length ? `params: ${names.join(", ")}` : "";
  };
  runs.addEventListener("change", showSchema);
  document.getElementById("submit-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = new FormData(event.target);
    const number = (name) => Number(form.get(name));
    const problem = document.getElementById("submit-problem");
    problem.textContent = "";
    const spec = {
      topology: { num_machines: number("num_machines"), num_processes: number("num_processes") },
      backend: form.get("backend"),
      batch_size: number("batch_size"),
      epochs: number("epochs"),
      lr: number("lr"),
      seed: number("seed"),
      priority: number("priority"),
      max_restarts: number("max_restarts"),
    };
    const [kind, what] = String(form.get("runs")).split(/:(.*)/s);
    if (kind === "script") {
      const args = String(form.get("script_args") || "").trim();
      spec.script = { path: what, args: args ? args.split(/\s+/) : [] };
    } else {
      spec.trainer = what;
    }
    const params = String(form.get("params") || "").trim();
    if (params) {
      try {
        spec.params = JSON.parse(params);
      } catch (error) {
        problem.textContent = `params: not JSON (${error.message})`;
        return;
      }
    }
    if (form.get("name")) spec.name = form.get("name");
    if (form.get("max_steps_per_epoch")) spec.max_steps_per_epoch = number("max_steps_per_epoch");
    if (form.get("max_run_seconds")) spec.max_run_seconds = number("max_run_seconds");
    try {
      const job = await api("/jobs", { method: "POST", body: JSON.stringify(spec) });
      location.href = `/ui/jobs/${job.id}`;
    } catch (error) {
      problem.textContent = error.message;
    }
  });
}

// --- nodes ---------------------------------------------------------------------------

const NODES_PAGE = 200;

function nodesPage() {
  page().innerHTML = `
    <h1>Nodes</h1>
    <div class="card"><table id="nodes">
      <thead><tr><th>name</th><th>address</th><th>state</th><th class="num">slots</th>
        <th class="num">cpus</th><th class="num">gpus</th><th>last heartbeat</th><th>running</th></tr></thead>
      <tbody></tbody></table><p id="nodes-count" class="muted"></p></div>`;
  every(LIST_POLL_MS, async () => {
    // One page (the oldest first): a cluster of thousands is not one table.
    const page = await api(`/nodes?limit=${NODES_PAGE}`);
    const nodes = page.data;
    const now = Date.now();
    document.getElementById("nodes-count").textContent =
      page.count > nodes.length ? `${nodes.length} of ${page.count} nodes` : `${page.count} node(s)`;
    document.querySelector("#nodes tbody").innerHTML = nodes.map((n) => `
      <tr><td>${esc(n.name)}</td><td>${esc(n.address)}</td><td>${badge(n.state)}</td>
        <td class="num">${n.slots}</td><td class="num">${n.cpus}</td><td class="num">${n.gpus}</td>
        <td>${duration((now - Date.parse(n.last_heartbeat_at)) / 1000)} ago</td>
        <td>${n.parts.map((p) => `<a href="/ui/jobs/${p.job_id}">job ${p.job_id}</a> m${p.machine_id} ${badge(p.status)}`).join(", ") || "–"}</td></tr>`
    ).join("") || `<tr><td colspan="8" class="muted">No worker has registered.</td></tr>`;
  });
}

// --- the queue -------------------------------------------------------------------------

function queuePage() {
  page().innerHTML = `
    <h1>Queue</h1>
    <div class="card">
      <p class="muted">Queued jobs in the order they are tried: higher priority first, then the
        earlier submitted. A job starts when every node it needs has a free slot; nothing later
        starts ahead of one that waits for slots (no backfill).</p>
      <p id="queue-summary"></p>
      <table id="queue"><thead><tr><th class="num">#</th><th class="num">job</th><th>name</th>
        <th>owner</th><th class="num">priority</th><th>needs</th><th>free now</th><th>code</th>
        <th>why it waits</th><th>queued</th></tr></thead><tbody></tbody></table>
    </div>`;
  every(LIST_POLL_MS, async () => {
    const queue = await api("/queue");
    document.getElementById("queue-summary").textContent =
      `${queue.count} queued · ${queue.nodes_live} live node(s) · ${queue.slots_free} free slot(s)`;
    const now = Date.now();
    document.querySelector("#queue tbody").innerHTML = queue.data.map((q) => {
      const n = q.needs;
      const what = n.script ? `script ${n.script}` : `trainer ${n.trainer}`;
      const gpus = n.gpus_per_node ? `, ${n.gpus_per_node} GPU each` : "";
      const p = q.pending;
      return `<tr data-job="${q.job_id}">
        <td class="num position">${q.position}</td>
        <td class="num"><a href="/ui/jobs/${q.job_id}">${q.job_id}</a></td>
        <td>${esc(q.name || "")}</td><td class="owner">${esc(q.owner || "–")}</td>
        <td class="num priority">${q.priority}</td>
        <td class="needs">${n.nodes} node(s) × ${n.slots_per_node} slot${gpus}, ${esc(what)}</td>
        <td class="free" title="free / suitable / live">${p.nodes_free} free of ${p.nodes_suitable} suitable, ${p.nodes_live} live</td>
        <td><code class="code">${esc(p.code)}</code></td>
        <td class="reason">${esc(p.reason)}${p.preempting.length ? `<div class="preempting small">preempting ${p.preempting.map((id) => `<a href="/ui/jobs/${id}">job ${id}</a>`).join(", ")}</div>` : ""}</td>
        <td>${duration((now - Date.parse(q.created_at)) / 1000)} ago</td></tr>`;
    }).join("") || `<tr><td colspan="10" class="muted">Nothing is queued.</td></tr>`;
  });
}

// --- compare ------------------------------------------------------------------------------

// Several jobs' curves of one metric on one chart, over their steps:
// /ui/compare?jobs=3,4&metric=loss.
function comparePage() {
  const params = new URLSearchParams(location.search);
  const ids = (params.get("jobs") || "").split(",").map((v) => Number(v.trim()))
    .filter((v) => Number.isInteger(v) && v > 0);
  let metric = params.get("metric") || "loss";
  page().innerHTML = `
    <h1>Compare</h1>
    <div class="card">
      <form id="compare-form" class="row filter" style="margin-bottom:10px">
        <label>Jobs <input name="jobs" value="${esc(ids.join(", "))}" placeholder="e.g. 3, 4" size="16"></label>
        <label>Metric <select name="metric" id="metric"></select></label>
        <button type="submit">Show</button>
        <span class="muted small">or tick jobs on the <a href="/ui/jobs">Jobs</a> page</span>
      </form>
      <div id="compare-chart" class="chart"></div>
      <p id="compare-empty" class="muted" hidden></p>
      <table id="compare-jobs"><thead><tr><th class="num">job</th><th>name</th><th>owner</th>
        <th>status</th><th>topology</th><th class="num">batch</th><th class="num">points</th>
        <th class="num">last</th></tr></thead><tbody></tbody></table>
    </div>`;
  const form = document.getElementById("compare-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const jobs = String(data.get("jobs")).split(/[\s,]+/).filter(Boolean).join(",");
    location.search = `?jobs=${encodeURIComponent(jobs)}&metric=${encodeURIComponent(data.get("metric") || "loss")}`;
  });
  document.getElementById("metric").addEventListener("change", (event) => {
    metric = event.target.value;
    history.replaceState(null, "", `?jobs=${ids.join(",")}&metric=${encodeURIComponent(metric)}`);
    drawn = "";
    refresh();
  });
  const empty = document.getElementById("compare-empty");
  if (ids.length === 0) {
    empty.hidden = false;
    empty.textContent = "Name two or more jobs to overlay their curves.";
    document.getElementById("compare-chart").hidden = true;
    return;
  }
  const valueOf = (point, name) => (name in point ? point[name] : point.metrics[name]) ?? null;
  let drawn = "";
  const refresh = async () => {
    const found = await Promise.all(ids.map(async (id) => {
      try {
        return { id, job: await api(`/jobs/${id}`), metrics: await api(`/jobs/${id}/metrics?max_points=500`) };
      } catch (error) {
        if (error.status === 404) return { id, missing: error.message };
        throw error;
      }
    }));
    const names = [...new Set(found.flatMap((f) => (f.metrics ? f.metrics.names : [])))];
    if (!names.includes(metric)) names.unshift(metric);
    const select = document.getElementById("metric");
    select.innerHTML = names.map((n) => `<option ${n === metric ? "selected" : ""}>${esc(n)}</option>`).join("");
    document.querySelector("#compare-jobs tbody").innerHTML = found.map((f) => {
      if (f.missing) return `<tr data-job="${f.id}"><td class="num">${f.id}</td><td colspan="7" class="problem">${esc(f.missing)}</td></tr>`;
      const points = f.metrics.points.filter((q) => valueOf(q, metric) !== null);
      const last = points.length ? valueOf(points[points.length - 1], metric) : null;
      return `<tr data-job="${f.id}"><td class="num"><a href="/ui/jobs/${f.id}">${f.id}</a></td>
        <td>${esc(f.job.name || "")}</td><td>${esc(f.job.owner || "–")}</td><td>${badge(f.job.status)}</td>
        <td>${topology(f.job.spec)}</td><td class="num">${f.job.spec.batch_size}</td>
        <td class="num points">${points.length}</td><td class="num">${fixed(last, 4)}</td></tr>`;
    }).join("");
    const traces = found.filter((f) => f.metrics).map((f) => {
      const points = f.metrics.points.filter((q) => valueOf(q, metric) !== null);
      return { x: points.map((q) => q.step), y: points.map((q) => valueOf(q, metric)),
        name: `job ${f.id}${f.job.name ? ` ${f.job.name}` : ""}`, mode: "lines+markers", marker: { size: 4 } };
    });
    const key = JSON.stringify([metric, traces.map((t) => t.x.length)]);
    const anything = traces.some((t) => t.x.length > 0);
    empty.hidden = anything;
    empty.textContent = anything ? "" : `No job here has reported ${metric} yet.`;
    document.getElementById("compare-chart").hidden = !anything;
    if (anything && key !== drawn && typeof Plotly !== "undefined") {
      drawn = key;
      Plotly.react("compare-chart", traces, {
        margin: { l: 60, r: 20, t: 10, b: 40 },
        xaxis: { title: { text: "step" } },
        yaxis: { title: { text: metric } },
        legend: { orientation: "h", y: 1.12 },
        font: { family: getComputedStyle(document.body).fontFamily, size: 12 },
      }, { displayModeBar: false, responsive: true });
    }
    return found.some((f) => f.job && !TERMINAL.has(f.job.status)) || key !== drawn;
  };
  every(LIST_POLL_MS, refresh);
}

// --- studies ---------------------------------------------------------------------------

const studyRowCells = (row) => `
  <td class="num"><a href="/ui/jobs/${row.job_id}">${row.job_id}</a></td>
  <td>${row.num_machines} × ${row.num_processes}</td><td class="num">${row.batch_size}</td>
  <td>${badge(row.status)}</td><td class="num">${row.threads_per_process ?? "–"}</td>
  <td class="num">${duration(row.wall_seconds)}</td><td class="num">${fixed(row.training_seconds, 1)}</td>
  <td class="num">${rate(row.samples_per_sec)}</td><td class="num">${fixed(row.speedup, 2)}</td>
  <td class="num">${fixed(row.efficiency, 2)}</td><td class="num">${percent(row.test_accuracy)}</td>`;

const STUDY_HEAD = `<thead><tr><th class="num">job</th><th>topology</th><th class="num">batch</th>
  <th>status</th><th class="num">threads</th><th class="num">wall</th><th class="num">train s</th>
  <th class="num">samples/s</th><th class="num">speedup</th><th class="num">efficiency</th>
  <th class="num">accuracy</th></tr></thead>`;

function studiesPage() {
  page().innerHTML = `
    <h1>Studies</h1>
    <div class="card"><p class="muted">A study runs the same training over several topologies,
      one job after another (POST /studies, or <code>ddpo study</code>).</p>
      <table id="studies"><thead><tr><th class="num">id</th><th>name</th><th>status</th>
        <th>rows</th><th>created</th></tr></thead><tbody></tbody></table></div>`;
  every(LIST_POLL_MS, async () => {
    const studies = await api("/studies?limit=100");
    document.querySelector("#studies tbody").innerHTML = studies.data.map((st) => `
      <tr><td class="num"><a href="/ui/studies/${st.id}">${st.id}</a></td><td>${esc(st.name || "")}</td>
        <td>${badge(st.status)}</td><td>${st.rows.map((r) => `${r.num_machines}×${r.num_processes}`).join(", ")}</td>
        <td>${when(st.created_at)}</td></tr>`).join("") ||
      `<tr><td colspan="5" class="muted">No studies yet.</td></tr>`;
  });
}

function studyPage(id) {
  page().innerHTML = `
    <h1>Study ${id} <span id="study-name" class="muted"></span> <span id="status"></span></h1>
    <div class="card"><h2>Speedup against the ideal</h2><div id="speedup-chart" class="chart"></div>
      <p id="speedup-empty" class="muted" hidden>No row has finished yet.</p></div>
    <div class="card"><h2>Rows <span class="muted small">(speedup and efficiency against the first row's training time)</span></h2>
      <table id="study-rows">${STUDY_HEAD}<tbody></tbody></table></div>`;
  let drawn = "";
  every(LIST_POLL_MS, async () => {
    const study = await orNotFound(`/studies/${id}`, `Study ${id}`, "/ui/studies", "All studies");
    if (study === null) return false;
    document.title = `ddpo · study ${study.id} ${study.status}`;
    document.getElementById("study-name").textContent = study.name || "";
    document.getElementById("status").innerHTML = badge(study.status);
    document.querySelector("#study-rows tbody").innerHTML = study.rows.map((row) =>
      `<tr data-job="${row.job_id}">${studyRowCells(row)}</tr>`).join("");
    const done = study.rows.filter((r) => r.speedup !== null);
    const key = JSON.stringify(done.map((r) => r.speedup));
    document.getElementById("speedup-empty").hidden = done.length > 0;
    document.getElementById("speedup-chart").hidden = done.length === 0;
    if (done.length && key !== drawn && typeof Plotly !== "undefined") {
      drawn = key;
      const base = study.rows[0].world_size;
      const sizes = study.rows.map((r) => r.world_size);
      Plotly.react("speedup-chart", [
        { x: sizes, y: sizes.map((w) => w / base), name: "ideal (linear)", mode: "lines", line: { color: "#999", dash: "dash" } },
        { x: done.map((r) => r.world_size), y: done.map((r) => r.speedup), name: "measured",
          text: done.map((r) => `${r.num_machines} × ${r.num_processes}`), mode: "lines+markers+text",
          textposition: "top center", line: { color: "#2f6fde" } },
      ], {
        margin: { l: 50, r: 20, t: 10, b: 40 },
        xaxis: { title: { text: "processes (world size)" }, tickvals: sizes },
        yaxis: { title: { text: "speedup" }, rangemode: "tozero" },
        legend: { orientation: "h", y: 1.12 },
        font: { family: getComputedStyle(document.body).fontFamily, size: 12 },
      }, { displayModeBar: false, responsive: true });
    }
    return !TERMINAL.has(study.status) || key !== drawn;
  });
}

// --- sweeps ----------------------------------------------------------------------------

const value = (v) => (v === null || v === undefined ? "–" : Number(v).toPrecision(4));
const paramText = (v) => (typeof v === "number" && !Number.isInteger(v) ? value(v) : String(v));

function sweepsPage() {
  page().innerHTML = `
    <h1>Sweeps</h1>
    <div class="card"><p class="muted">A sweep runs one spec over many hyperparameters, each
      trial a job on the queue, the poor ones stopped early (POST /sweeps, or <code>ddpo sweep</code>).</p>
      <table id="sweeps"><thead><tr><th class="num">id</th><th>name</th><th>status</th>
        <th class="num">trials</th><th>objective</th><th class="num">best</th><th>created</th></tr></thead><tbody></tbody></table></div>`;
  every(LIST_POLL_MS, async () => {
    const sweeps = await api("/sweeps?limit=100");
    document.querySelector("#sweeps tbody").innerHTML = sweeps.data.map((sw) => `
      <tr><td class="num"><a href="/ui/sweeps/${sw.id}">${sw.id}</a></td><td>${esc(sw.name || "")}</td>
        <td>${badge(sw.status)}</td><td class="num">${sw.trials.length}/${sw.max_trials}</td>
        <td>${esc(sw.objective.metric)} (${esc(sw.objective.direction)})</td>
        <td class="num">${sw.best ? value(sw.best.value) : "–"}</td><td>${when(sw.created_at)}</td></tr>`).join("") ||
      `<tr><td colspan="7" class="muted">No sweeps yet.</td></tr>`;
  });
}

function sweepPage(id) {
  page().innerHTML = `
    <h1>Sweep ${id} <span id="sweep-name" class="muted"></span> <span id="status"></span></h1>
    <div class="card"><p id="sweep-summary"></p><p id="sweep-best"></p>
      <button id="sweep-cancel" hidden>Cancel the sweep</button></div>
    <div class="card"><h2>Parameters against the objective <span class="muted small">(one line per succeeded trial)</span></h2>
      <div id="parcoords-chart" class="chart"></div>
      <p id="parcoords-empty" class="muted" hidden>No trial has succeeded yet.</p></div>
    <div class="card"><h2>The objective per trial, over steps</h2><div id="objective-chart" class="chart"></div></div>
    <div class="card"><h2>Trials <span class="muted small">(★ the best)</span></h2>
      <table id="sweep-trials"><thead></thead><tbody></tbody></table></div>`;
  let drawn = "";
  let sweep = null;
  document.getElementById("sweep-cancel").addEventListener("click", async () => {
    if (!confirm(`Cancel sweep ${id} and its running trials?`)) return;
    try {
      await api(`/sweeps/${id}/cancel`, { method: "POST" });
    } catch (error) {
      connection(false, error.message);
    }
  });
  every(LIST_POLL_MS, async () => {
    sweep = await orNotFound(`/sweeps/${id}`, `Sweep ${id}`, "/ui/sweeps", "All sweeps");
    if (sweep === null) return false;
    const names = Object.keys(sweep.space);
    const best = sweep.best ? sweep.best.number : null;
    document.title = `ddpo · sweep ${sweep.id} ${sweep.status}`;
    document.getElementById("sweep-name").textContent = sweep.name || "";
    document.getElementById("status").innerHTML = badge(sweep.status);
    const counts = Object.entries(sweep.counts).filter(([, n]) => n).map(([s, n]) => `${n} ${esc(s)}`).join(", ");
    document.getElementById("sweep-summary").innerHTML = `${sweep.trials.length} of ${sweep.max_trials} trials,
      ${sweep.max_concurrent} at a time (${counts || "none yet"}); objective <b>${esc(sweep.objective.metric)}</b>
      (${esc(sweep.objective.direction)}); sampler ${esc(sweep.sampler.kind)}; early stopping ${esc(sweep.pruner.kind)};
      slot-time ${duration(sweep.slot_seconds)}`;
    document.getElementById("sweep-best").innerHTML = sweep.best
      ? `Best: trial ${sweep.best.number} (<a href="/ui/jobs/${sweep.best.job_id}">job ${sweep.best.job_id}</a>),
        ${esc(sweep.objective.metric)} ${value(sweep.best.value)}, with ${names.map((n) =>
          `${esc(n)} = ${esc(paramText(sweep.best.params[n]))}`).join(", ")}`
      : "No trial has succeeded yet.";
    document.getElementById("sweep-cancel").hidden = sweep.status !== "running" || !maySteer(sweep);
    document.querySelector("#sweep-trials thead").innerHTML = `<tr><th class="num">trial</th><th class="num">job</th>
      ${names.map((n) => `<th class="num">${esc(n)}</th>`).join("")}<th>state</th><th class="num">step</th>
      <th class="num">${esc(sweep.objective.metric)}</th><th class="num">accuracy</th></tr>`;
    document.querySelector("#sweep-trials tbody").innerHTML = sweep.trials.map((t) => `
      <tr data-trial="${t.number}" class="${t.number === best ? "best" : ""}">
        <td class="num">${t.number === best ? "★ " : ""}${t.number}</td>
        <td class="num"><a href="/ui/jobs/${t.job_id}">${t.job_id}</a></td>
        ${names.map((n) => `<td class="num">${esc(paramText(t.params[n]))}</td>`).join("")}
        <td>${badge(t.state)}${t.state === "pruned" && t.pruned_at_step !== null ? ` <span class="muted small">at step ${t.pruned_at_step}</span>` : ""}</td>
        <td class="num">${t.step ?? "–"}</td><td class="num" data-value="${t.value ?? ""}">${value(t.value)}</td>
        <td class="num">${percent(t.test_accuracy)}</td></tr>`).join("");
    const key = JSON.stringify(sweep.trials.map((t) => [t.state, t.step, t.value]));
    if (key !== drawn && typeof Plotly !== "undefined") {
      drawn = key;
      drawSweep(sweep, names);
    }
    return !TERMINAL.has(sweep.status);
  });
}

function drawSweep(sweep, names) {
  const font = { family: getComputedStyle(document.body).fontFamily, size: 12 };
  const done = sweep.trials.filter((t) => t.state === "succeeded" && t.value !== null);
  document.getElementById("parcoords-empty").hidden = done.length > 0;
  document.getElementById("parcoords-chart").hidden = done.length === 0;
  if (done.length) {
    const dimension = (n) => {
      const values = done.map((t) => t.params[n]);
      if (values.every((v) => typeof v === "number")) {
        const logScale = sweep.space[n].log === true;
        return logScale
          ? { label: `log10 ${n}`, values: values.map((v) => Math.log10(v)) }
          : { label: n, values };
      }
      const choices = [...new Set(values.map(String))];
      return { label: n, values: values.map((v) => choices.indexOf(String(v))),
        tickvals: choices.map((_, i) => i), ticktext: choices };
    };
    const objective = done.map((t) => t.value);
    Plotly.react("parcoords-chart", [{
      type: "parcoords",
      line: { color: objective, colorscale: "Viridis", reversescale: sweep.objective.direction === "minimize",
        showscale: true, colorbar: { title: { text: sweep.objective.metric } } },
      dimensions: [...names.map(dimension), { label: sweep.objective.metric, values: objective }],
    }], { margin: { l: 60, r: 60, t: 40, b: 20 }, font }, { displayModeBar: false, responsive: true });
  }
  const best = sweep.best ? sweep.best.number : null;
  Plotly.react("objective-chart", sweep.trials.filter((t) => t.values.length).map((t) => ({
    x: t.values.map((p) => p[0]), y: t.values.map((p) => p[1]), mode: "lines",
    name: `trial ${t.number}${t.state === "pruned" ? " (pruned)" : ""}`,
    line: { width: t.number === best ? 3 : 1.5, dash: t.state === "pruned" ? "dot" : "solid" },
  })), {
    margin: { l: 50, r: 20, t: 10, b: 40 },
    xaxis: { title: { text: "step" } }, yaxis: { title: { text: sweep.objective.metric } },
    font,
  }, { displayModeBar: false, responsive: true });
}

// --- routing ---------------------------------------------------------------------------

function route() {
  const path = location.pathname.replace(/\/+$/, "");
  const job = path.match(/^\/ui\/jobs\/(\d+)$/);
  const study = path.match(/^\/ui\/studies\/(\d+)$/);
  const sweep = path.match(/^\/ui\/sweeps\/(\d+)$/);
  const section = job ? "jobs" : study ? "studies" : sweep ? "sweeps" : path.split("/")[2] || "jobs";
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === section));
  if (job) return jobPage(Number(job[1]));
  if (study) return studyPage(Number(study[1]));
  if (sweep) return sweepPage(Number(sweep[1]));
  if (section === "studies") return studiesPage();
  if (section === "sweeps") return sweepsPage();
  if (section === "submit") return submitPage();
  if (section === "nodes") return nodesPage();
  if (section === "queue") return queuePage();
  if (section === "compare") return comparePage();
  if (section === "jobs") return jobsPage();
  page().innerHTML = `<h1>No page ${esc(path)}</h1><div class="card"><p>The dashboard has
    <a href="/ui/jobs">jobs</a>, <a href="/ui/queue">the queue</a>, <a href="/ui/compare">compare</a>,
    <a href="/ui/studies">studies</a>, <a href="/ui/sweeps">sweeps</a>, <a href="/ui/submit">submit</a> and <a href="/ui/nodes">nodes</a>.</p></div>`;
}

// Who this browser acts as: the key's name (or token:<role>) and its role;
// null until known, and on a server without tokens.
let ME = null;

async function showWhoAmI() {
  try {
    const me = await api("/whoami");
    if (me.name) {
      ME = me;
      document.getElementById("whoami").textContent = `${me.name} (${me.role})`;
    }
  } catch (error) {
    // The page itself says what is wrong with the token.
  }
}

// As the server decides (api/core/people.py): the owner, an admin, or anyone
// for a job with no owner. Unknown yet: offered, and the server decides.
function maySteer(job) {
  return ME === null || ME.role === "admin" || !job.owner || job.owner === ME.name;
}

showSignOut();
route();
showWhoAmI();
