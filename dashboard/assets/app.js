// Keeps the overview, workers and bulk jobs live (polling every 2 s), and asks before
// destructive buttons. Everything is written with textContent: no server data becomes HTML.
"use strict";

const base = document.querySelector('meta[name="ferriq-base"]')?.content ?? "";

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "-" : String(text);
  row.appendChild(td);
  return td;
}

function fill(tbodyId, items, render, empty) {
  const body = document.getElementById(tbodyId);
  if (!body) return;
  const cols = body.closest("table").querySelectorAll("thead th").length;
  body.replaceChildren();
  if (items.length === 0) {
    const tr = document.createElement("tr");
    const td = cell(tr, empty);
    td.colSpan = cols;
    td.className = "empty";
    body.appendChild(tr);
    return;
  }
  for (const item of items) {
    const tr = document.createElement("tr");
    render(tr, item);
    body.appendChild(tr);
  }
}

const renderers = {
  overview(data) {
    fill("lanes", data.lanes, (tr, l) => {
      const td = document.createElement("td");
      const a = document.createElement("a");
      a.href = `${base}/dead?lane=${encodeURIComponent(l.lane)}`;
      a.textContent = l.lane;
      td.appendChild(a);
      tr.appendChild(td);
      for (const k of ["ready", "in_flight", "delayed", "dead", "consumers", "running"]) cell(tr, l[k]);
    }, "no lanes");
  },
  workers(data) {
    fill("workers", data.workers, (tr, w) => {
      cell(tr, w.id);
      cell(tr, `${w.host} (pid ${w.pid})`);
      cell(tr, w.version);
      cell(tr, w.lanes.join(", "));
      cell(tr, `${w.runs.length} / ${w.concurrency}`);
      const oldest = w.runs.reduce((m, r) => Math.max(m, r.age_s), -1);
      cell(tr, oldest < 0 ? "-" : `${oldest} s`);
      cell(tr, `${w.seen_s.toFixed(1)} s ago`);
    }, "no worker has reported within its lease");
    const runs = data.workers
      .flatMap((w) => w.runs.map((r) => ({ worker: w.id, ...r })))
      .sort((a, b) => b.age_s - a.age_s);
    fill("runs", runs, (tr, r) => {
      cell(tr, r.worker);
      cell(tr, r.task);
      const td = document.createElement("td");
      const a = document.createElement("a");
      a.href = `${base}/tasks?id=${encodeURIComponent(r.task_id)}`;
      a.textContent = r.task_id.length > 12 ? `${r.task_id.slice(0, 12)}…` : r.task_id;
      td.appendChild(a);
      tr.appendChild(td);
      cell(tr, r.lane);
      cell(tr, r.attempt);
      cell(tr, `${r.age_s} s`);
    }, "nothing runs now");
  },
  jobs(data) {
    const box = document.getElementById("jobs");
    if (!box) return;
    box.replaceChildren();
    for (const j of data.jobs.slice().reverse()) {
      const p = document.createElement("p");
      p.className = "job";
      p.dataset.finished = j.finished;
      const bar = document.createElement("progress");
      if (j.finished) { bar.max = 1; bar.value = 1; } else { bar.removeAttribute("value"); }
      p.append(`${j.kind} #${j.id} on ${j.lane}: `, bar,
        ` ${j.done} done of ${j.seen} looked at` + (j.outcome ? ` — ${j.outcome}` : ""));
      box.appendChild(p);
    }
  },
};

// The overview's history: its charts reloaded and its per-task table refreshed every 10 s.
async function refreshCharts(marker) {
  const params = new URLSearchParams(location.search);
  const hours = params.get("hours") ?? "6";
  for (const img of marker.querySelectorAll("img")) {
    const url = new URL(img.src);
    url.searchParams.set("t", Date.now());
    img.src = url.toString();
  }
  try {
    const res = await fetch(`${base}/api/history?hours=${encodeURIComponent(hours)}`, { credentials: "same-origin" });
    if (!res.ok) return;
    const data = await res.json();
    fill("history", data.tasks, (tr, t) => {
      const td = document.createElement("td");
      const a = document.createElement("a");
      a.href = `${base}/?hours=${encodeURIComponent(hours)}&task=${encodeURIComponent(t.task)}`;
      a.textContent = t.task;
      td.appendChild(a);
      tr.appendChild(td);
      for (const k of ["runs", "succeeded", "failed", "p50", "p95"]) cell(tr, t[k]);
    }, "nothing ran in this window (or workers run with FERRIQ_HISTORY=0)");
  } catch (e) {
    // The next round tries again; the lanes' marker shows connection trouble.
  }
}

const endpoints = { overview: "/api/overview", workers: "/api/workers", jobs: "/api/jobs" };

async function poll(kind, marker) {
  try {
    const res = await fetch(base + endpoints[kind], { credentials: "same-origin" });
    if (!res.ok) {
      // JSON from the API, plain text from the guard (a token, a refusal).
      const text = await res.text();
      let message = text.trim() || res.statusText;
      try { message = JSON.parse(text).error ?? message; } catch (_) { /* plain text */ }
      throw new Error(message);
    }
    const data = await res.json();
    renderers[kind](data);
    if (marker.classList) {
      marker.classList.remove("stale");
      if (kind !== "jobs") marker.textContent = `live: updated ${new Date().toLocaleTimeString()}`;
    }
  } catch (e) {
    if (marker.classList && kind !== "jobs") {
      marker.classList.add("stale");
      marker.textContent = `not updated: ${e.message}`;
    }
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const marker of document.querySelectorAll("[data-live]")) {
    const kind = marker.dataset.live;
    if (kind === "charts") {
      setInterval(() => refreshCharts(marker), 10000);
      continue;
    }
    if (!endpoints[kind]) continue;
    poll(kind, marker);
    setInterval(() => poll(kind, marker), 2000);
  }
  for (const button of document.querySelectorAll("button[data-confirm]")) {
    button.addEventListener("click", (ev) => {
      if (!window.confirm(button.dataset.confirm)) ev.preventDefault();
    });
  }
});
