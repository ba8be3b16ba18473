// Training: start a TinyGPT run, follow its server-sent events, scrub the recorded steps.
"use strict";

(() => {
  const controls = document.getElementById("controls");
  const startButton = document.getElementById("start"), stopButton = document.getElementById("stop");
  const bar = document.getElementById("bar"), status = document.getElementById("status");
  const scrub = document.getElementById("scrub"), scrubOut = document.getElementById("scrub-out");
  const curves = document.getElementById("curves"), maps = document.getElementById("maps");
  const mapsTitle = document.getElementById("maps-title");
  let state = null, source = null, pending = false, follow = true;
  // The server keeps at most this many maps of a run (and this many numbers in them); the page too.
  let maxFrames = 64, maxValues = 1 << 20;
  Lab.api("limits").then((l) => { maxFrames = l.max_frames_per_run; maxValues = l.max_frame_values_per_run; })
    .catch(() => {});

  function reset(params) {
    state = { params: params || {}, total: params ? params.steps : 0, loss: [], accuracy: [], snapshots: [],
              probe: null, status: "running", end: null };
    follow = true;
  }

  function setStatus(kind, text) {
    status.dataset.status = kind;
    status.textContent = text;
    const running = kind === "running" || kind === "starting";
    startButton.disabled = running;
    stopButton.disabled = !running;
    scrub.disabled = running || !state || state.snapshots.length === 0;
  }

  function drawCurves() {
    curves.innerHTML = "";
    const pts = (xs) => xs.map((y, i) => [i + 1, y]);
    Lab.lineChart(curves, [{ name: "loss (cross-entropy, answer tokens)", color: "#c0392b", points: pts(state.loss) }],
                  { title: "loss", xLabel: "step", yMin: 0, width: 420, height: 200 });
    Lab.lineChart(curves, [{ name: "accuracy (answer tokens)", color: "#1b7f4b", points: pts(state.accuracy) }],
                  { title: "accuracy", xLabel: "step", yMin: 0, yMax: 1, width: 420, height: 200 });
  }

  function drawMaps(index) {
    maps.innerHTML = "";
    const snap = state.snapshots[index];
    if (!snap) return;
    const t = snap.weights[0][0].length;
    const labels = state.probe ? state.probe.slice(0, t).map(String) : [...Array(t).keys()].map(String);
    snap.weights.forEach((layer, l) => {
      const row = document.createElement("div");
      layer.forEach((w, h) => Lab.heatmap(row, w.map((r, i) => r.map((x, j) => (j > i ? null : x))), {
        title: `layer ${l} · head ${h}`, min: 0, max: 1, width: 190, rowLabels: labels, colLabels: labels, noScale: true,
      }));
      maps.appendChild(row);
    });
    maps.dataset.step = String(snap.step);
    maps.dataset.digest = Lab.digest(snap.weights);
    mapsTitle.textContent = `Attention maps of the probe sequence at step ${snap.step}` +
      (state.probe ? ` (tokens: ${state.probe.join(" ")})` : "");
    scrubOut.textContent = String(snap.step);
  }

  function draw() {
    pending = false;
    if (!state) return;
    const done = state.loss.length;
    bar.style.width = state.total ? `${(100 * done) / state.total}%` : "0";
    drawCurves();
    scrub.max = String(Math.max(0, state.snapshots.length - 1));
    if (follow) scrub.value = scrub.max;
    drawMaps(Number(scrub.value));
    const last = done ? ` · loss ${Lab.fmt(state.loss[done - 1], 3)} · accuracy ${Lab.fmt(state.accuracy[done - 1], 3)}` : "";
    if (state.status === "running") setStatus("running", `step ${done} / ${state.total}${last}`);
    else if (state.status === "error") setStatus("error", `error: ${state.end.message}`);
    else setStatus(state.status, `${state.status} after ${state.end.steps} steps · held-out accuracy ` +
                   `${Lab.fmt(state.end.eval_accuracy, 3)} · exact answers ${Lab.fmt(state.end.eval_exact, 3)}`);
  }

  function later() {
    if (!pending) { pending = true; setTimeout(draw, 120); }
  }

  // Like the server: past the budget, drop every other kept map (the first and the newest stay).
  function thin(snapshots) {
    const w = snapshots[0].weights, size = w.length * w[0].length * w[0][0].length * w[0][0].length;
    const cap = Math.max(2, Math.min(maxFrames, Math.floor(maxValues / size)));
    while (snapshots.length > cap) snapshots = snapshots.filter((_, i, a) => i % 2 === 0 || i === a.length - 1);
    return snapshots;
  }

  function onEvent(e) {
    if (e.type === "queued") reset(e.params);
    else if (e.type === "step") {
      state.loss.push(e.loss); state.accuracy.push(e.accuracy);
      if (e.attention) state.snapshots = thin([...state.snapshots, { step: e.step, weights: e.attention }]);
    } else if (e.type === "done" || e.type === "stopped" || e.type === "error") {
      state.status = e.type; state.end = e; state.probe = e.probe || null;
      if (source) { source.close(); source = null; }
    }
    later();
  }

  function listen() {
    if (source) source.close();
    source = new EventSource("/api/train/events");
    source.onmessage = (m) => onEvent(JSON.parse(m.data));
    source.onerror = () => {  // CLOSED: refused (e.g. 429, too many pages watching this run), not a blip
      if (source && source.readyState === EventSource.CLOSED) {
        source = null;
        Lab.showError("the training's event stream was refused (too many pages watching this run?): reload to retry");
      }
    };
  }

  startButton.addEventListener("click", async () => {
    const body = {};
    for (const name of ["task", "steps", "pos", "length", "n_heads", "n_layers", "seed", "dtype"]) {
      const v = Lab.value(controls, name);
      if (v !== null && v !== "") body[name] = v;
    }
    setStatus("starting", "starting…");
    try {
      await Lab.api("train/start", body);
      Lab.showError("");
      reset(null);
      listen();
    } catch (e) {
      setStatus("idle", "idle");
      Lab.showError(e.message);
    }
  });
  stopButton.addEventListener("click", () => Lab.api("train/stop", {}).catch((e) => Lab.showError(e.message)));
  scrub.addEventListener("input", () => { follow = Number(scrub.value) === Number(scrub.max); drawMaps(Number(scrub.value)); });

  // A run already recorded for this client (a reload, or a return from another page).
  Lab.api("train/history").then((h) => {
    if (h.status === "none") { setStatus("idle", "idle: pick a task and start"); return; }
    if (h.status === "running") { reset(null); listen(); return; }
    reset(h.params);
    state.loss = h.loss; state.accuracy = h.accuracy; state.snapshots = h.attention;
    state.status = h.status; state.end = h.end; state.probe = h.probe;
    draw();
  }).catch((e) => Lab.showError(e.message));
})();
