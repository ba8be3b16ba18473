// Explain: the qkv.explain trace of the Q, K, V typed in, one card per step.
"use strict";

(() => {
  const controls = document.getElementById("controls");
  const steps = document.getElementById("steps");
  const summary = document.getElementById("summary");
  let maskSpec = () => ({ mask: "none", mask_params: {} });

  // Text -> rows of numbers; a token that is not a number is sent as is, so the server names it.
  function parse(text) {
    const rows = text.split("\n").map((line) => line.trim()).filter((line) => line !== "");
    return rows.map((line) => line.split(/[\s,;]+/).filter((t) => t !== "").map((t) => {
      const x = Number(t);
      return Number.isFinite(x) ? x : t;
    }));
  }

  function cellColour(v, absMax, weights) {
    if (typeof v !== "number") return "#e4e7ec";
    if (weights) return `rgba(36, 87, 197, ${0.08 + 0.6 * Math.min(1, v)})`;
    const t = absMax ? v / absMax : 0;
    return t >= 0 ? `rgba(200, 70, 50, ${0.5 * t})` : `rgba(36, 87, 197, ${-0.5 * t})`;
  }

  function matrixTable(value, weights) {
    const rows = Array.isArray(value[0]) ? value : [value];
    const nums = rows.flat(Infinity).filter((x) => typeof x === "number");
    const absMax = Math.max(0, ...nums.map(Math.abs));
    const table = document.createElement("table");
    table.className = "matrix";
    for (const row of rows.slice(0, 16)) {
      const tr = table.insertRow();
      for (const v of (Array.isArray(row) ? row : [row]).slice(0, 16)) {
        const td = tr.insertCell();
        td.textContent = Lab.fmt(v);
        td.style.background = cellColour(v, absMax, weights);
      }
    }
    return table;
  }

  function draw(trace) {
    steps.innerHTML = "";
    const o = trace.options;
    summary.textContent = `inputs: ${Object.entries(trace.inputs).map(([n, s]) => `${n} (${s.join("×")})`).join(", ")}` +
      ` · scale ${Lab.fmt(o.scale)}${o.default_scale ? " = 1/√Dk" : ""}` + (o.mask ? ` · mask ${o.mask}` : "") +
      (o.example ? " · the worked example" : "") +
      (o.dispatch ? ` · qkv.attention would run impl="${o.dispatch.impl}"` +
        (o.dispatch.engine ? ` (${o.dispatch.engine} engine)` : "") + `: ${o.dispatch.reason}` : "");
    for (const s of trace.steps) {
      const card = document.createElement("div");
      card.className = "card";
      card.dataset.step = s.name;
      const head = document.createElement("div");
      head.innerHTML = `<span class="shape"></span><b></b> <span class="formula"></span>`;
      head.querySelector(".shape").textContent = "(" + s.shape.join(", ") + ")";
      head.querySelector("b").textContent = s.name;
      head.querySelector(".formula").textContent = s.formula === s.name ? "" : s.formula;
      const note = document.createElement("div");
      note.className = "note";
      note.textContent = s.note;
      card.append(head, note, matrixTable(s.value, s.name === "A"));
      steps.appendChild(card);
    }
    steps.dataset.digest = Lab.digest(trace.steps.map((s) => s.value));
  }

  function body() {
    const b = { causal: Lab.value(controls, "causal"), grad: Lab.value(controls, "grad"), ...maskSpec() };
    const scale = controls.querySelector("[name=scale]").value.trim();
    if (scale !== "") b.scale = Number.isFinite(Number(scale)) ? Number(scale) : scale;
    for (const name of ["q", "k", "v"]) {
      const text = controls.querySelector(`[name=${name}]`).value;
      if (text.trim() !== "") b[name] = parse(text);
    }
    return b;
  }

  const refresh = Lab.live(controls, async () => {
    const trace = await Lab.api("explain", body());
    return () => draw(trace);
  }, 120);

  async function example() {
    const trace = await Lab.api("explain", {});
    for (const name of ["Q", "K", "V"]) {
      const value = trace.steps.find((s) => s.name === name).value;
      controls.querySelector(`[name=${name.toLowerCase()}]`).value = value.map((r) => r.join(" ")).join("\n");
    }
    draw(trace);
  }

  document.getElementById("example").addEventListener("click", () => example().then(refresh));
  Lab.maskControls(document.getElementById("mask")).then((get) => { maskSpec = get; return example(); })
    .catch((e) => Lab.showError(e.message));
})();
