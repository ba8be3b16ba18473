// Complexity: qkv.complexity.estimate as a table and as curves over N; "measure" times the call.
"use strict";

(async () => {
  const controls = document.getElementById("controls");
  const table = document.getElementById("table");
  const charts = document.getElementById("charts");
  const measured = document.getElementById("measured");
  const button = document.getElementById("measure");
  let maskSpec = () => ({ mask: "none", mask_params: {} });
  let measuredFor = null;  // the request the measurement shown belongs to

  function body() {
    const b = { ...maskSpec(), dtype: Lab.value(controls, "dtype"), impl: Lab.value(controls, "impl"),
                backward: Lab.value(controls, "backward") };
    for (const name of ["n", "d", "heads", "kv_heads", "batch"]) {
      const v = Lab.value(controls, name);
      if (v !== null) b[name] = v;
    }
    return b;
  }

  function row(name, value, note) {
    const tr = table.insertRow();
    const th = document.createElement("th");
    th.textContent = name;
    tr.appendChild(th);
    const td = tr.insertCell();
    td.className = "num"; td.textContent = value;
    tr.insertCell().textContent = note || "";
  }

  function draw(r) {
    const e = r.estimate;
    table.innerHTML = "";
    row("impl", e.impl, e.tiles ? `tiles ${e.tiles[0]} × ${e.tiles[1]}` : "");
    row("FLOPs", Lab.si(e.flops, "FLOP"), e.backward ? "forward + backward" : "forward: 2·B·H·pairs·(Dk + Dv)");
    row("pairs computed / head", Lab.si(e.pairs, ""), `${(100 * e.kept_fraction).toFixed(1)} % of Nq·Nk`);
    row("score matrix", Lab.si(e.score_bytes, "B"), "materialised (B, H, Nq, Nk)");
    row("peak extra memory", Lab.si(e.peak_bytes, "B"), "beyond inputs and output");
    row("KV cache", Lab.si(e.kv_cache_bytes, "B"), `K and V for ${e.kv_heads} KV heads`);
    row("inputs / output", `${Lab.si(e.input_bytes, "B")} / ${Lab.si(e.output_bytes, "B")}`, e.dtype);
    table.dataset.flops = String(e.flops);
    charts.innerHTML = "";
    const pts = (key) => r.series.map((s) => [s.n, s[key]]);
    Lab.lineChart(charts, [{ name: "FLOPs", color: "#2457c5", points: pts("flops"), marks: true }],
                  { title: "FLOPs", width: 440, logX: true, logY: true, xLabel: "N", marker: e.n_q, yFormat: (v) => Lab.si(v, "") });
    Lab.lineChart(charts, [
      { name: "peak extra memory", color: "#c0392b", points: pts("peak_bytes"), marks: true },
      { name: "score matrix", color: "#e08e45", points: pts("score_bytes"), dashed: true },
      { name: "KV cache", color: "#1b7f4b", points: pts("kv_cache_bytes"), dashed: true },
    ], { title: "bytes", width: 440, logX: true, logY: true, xLabel: "N", marker: e.n_q, yFormat: (v) => Lab.si(v, "B") });
    charts.dataset.digest = Lab.digest(r.series);
  }

  Lab.live(controls, async () => {
    const r = await Lab.api("complexity", body());
    const asked = JSON.stringify(body());
    return () => {
      if (asked !== measuredFor) { measured.textContent = ""; delete measured.dataset.seconds; }
      draw(r);
    };
  }, 80);

  button.addEventListener("click", async () => {
    button.disabled = true;
    measured.textContent = "measuring…";
    try {
      const asked = body();
      const m = await Lab.api("complexity/measure", asked);
      measuredFor = JSON.stringify(asked);
      measured.textContent = `measured: ${Lab.fmt(m.seconds * 1e3, 2)} ms per call (median of ${m.samples.length}, ` +
        `${m.arrays} arrays) · ${Lab.fmt(m.gflops_per_s, 2)} GFLOP/s against the estimate`;
      measured.dataset.seconds = String(m.seconds);
      Lab.showError("");
    } catch (e) {
      measured.textContent = "";
      Lab.showError(e.message);
    } finally {
      button.disabled = false;
    }
  });
  maskSpec = await Lab.maskControls(document.getElementById("mask"), "causal");
  controls.dispatchEvent(new Event("change"));
})().catch((e) => Lab.showError(e.message));
